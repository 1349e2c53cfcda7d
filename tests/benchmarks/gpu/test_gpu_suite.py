"""The GPU suite cannot rot while no GPU host is at hand: its dry run (every part at tiny sizes
on CPU) writes every part's figures, its limits fit the issue's 8 minutes, a part that outlives
its limit is recorded and the suite goes on, and the command docs/benchmarks.md gives fits a device call."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.gpu import gpu_parts
from benchmarks.gpu.gpu_suite import MARGIN_S, PARTS

ROOT = Path(__file__).resolve().parents[3]


def suite(out: Path, *args: str, timeout: float = 900) -> tuple[subprocess.CompletedProcess, dict]:
    proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu.gpu_suite", str(out), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    assert last == json.loads((out / "summary.json").read_text())
    return proc, last


@pytest.fixture(scope="module")
def dry(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_suite")
    _, summary = suite(out, "--dry")
    return out, summary


def part(out: Path, name: str) -> dict:
    return json.loads((out / f"{name}.json").read_text())


@pytest.mark.slow
def test_the_dry_run_finishes_every_part(dry):
    out, summary = dry
    assert summary["dry"] is True and summary["devices"] == ["cpu"]
    assert {name: p["status"] for name, p in summary["parts"].items()} == {p.name: "ok" for p in PARTS}
    assert sorted(f.name for f in out.iterdir()) == sorted([f"{p.name}.json" for p in PARTS] + ["summary.json",
                                                                                                  "suite.log"])
    assert len(list(out.iterdir())) <= 8  # what one device call brings back


@pytest.mark.slow
def test_the_train_part_has_both_frameworks_figures(dry):
    doc = part(dry[0], "train_step")
    assert doc["status"] == "ok" and doc["dtype"] == "bfloat16" and doc["remat"] == "full"
    (row,) = doc["results"]
    for fw in ("jax", "torch"):
        res = row[fw]
        assert res["status"] == "ok" and res["device"] == "cpu", res
        assert res["tokens_per_s"] > 0 and res["step_s"] > 0
    assert row["jax"]["compile_s"] > 0  # XLA's compile, timed on its own, plus the first step's extra
    torch = row["torch"]  # eager: no compile, its first step's extra over the median (noise may make it < 0)
    assert "compile_s" not in torch and torch["first_step_s"] > 0
    assert torch["warmup_s"] == pytest.approx(torch["first_step_s"] - torch["step_s"])
    assert row["jax"]["peak_bytes"] > 0 and row["jax"]["plan_bytes"] > 0
    assert row["speedup_vs_torch"] == pytest.approx(row["jax"]["tokens_per_s"] / row["torch"]["tokens_per_s"])
    for fw, source in (("jax", "/host:CPU"), ("torch", "cpu ops")):  # the target's row says where its time went
        profile = row[fw]["profile"]
        assert profile["source"] == source and profile["steps"] == 2 and profile["busy_s"] > 0, profile
        assert profile["top"] and sum(profile["by_kind_s"].values()) == pytest.approx(profile["busy_s"])
    summary = dry[1]["parts"]["train_step"]["figures"][0]
    assert set(summary["jax"]["profile"]) >= {"busy_share", *row["jax"]["profile"]["by_kind_s"]}
    plan = row["jax"]["memory_plan"]  # the case that must fit: what XLA's plan of our step holds
    assert plan["module"].endswith("after_optimizations") and plan["temp_bytes"] > 0 and plan["parameter_bytes"] > 0
    assert plan["largest_temps"][0]["bytes"] == max(v["bytes"] for v in plan["largest_temps"])
    assert len(summary["jax"]["largest_gib"]) == 3
    targets = doc["targets"]
    assert len(targets) == 3
    assert targets["MFU, micro at 256 tokens"] == {"value": None, "target": ">= 0.45", "met": None}  # no CPU peak


@pytest.mark.slow
def test_the_vision_part_runs_five_screenshots_and_one(dry):
    doc = part(dry[0], "vision_tower")
    five, one = doc["results"]
    assert (five["screenshots"], one["screenshots"]) == (5, 1)
    for r in (five, one):
        assert r["status"] == "ok" and r["peak_bytes"] > 0 and r["step_s"] > 0 and r["compile_s"] > 0, r
        assert r["grid_thw"] == [1, 18, 32] and r["tokens"] == 144
    assert five["slots"] == 5 * one["slots"]
    assert five["memory_plan"]["largest_temps"] and "memory_plan" not in one  # the target's case alone
    assert five["peak_bytes"] > one["peak_bytes"]
    assert doc["targets"]["peak GiB, 5 screenshots"]["met"] is True


@pytest.mark.slow
def test_the_kernel_part_compares_both_shapes_at_both_lengths(dry):
    doc = part(dry[0], "loss_kernel")
    cases = [(r["model"], r["tokens"]) for r in doc["results"]]
    assert cases == [("0.5B", 256), ("7B", 256), ("0.5B", 512), ("7B", 512)]
    for r in doc["results"]:
        assert r["naive_status"] == r["fused_status"] == "ok"
        assert r["naive_s"] > 0 and r["fused_s"] > 0 and r["naive_temp_bytes"] > 0 and r["fused_temp_bytes"] > 0
        assert r["chunk_vocab"] == 5120 and r["chunk_tokens"] == r["tokens"]  # kernels.auto_chunks on CPU
        assert r["grad_rel_err"] < 2e-2  # bf16 operands, fp32 accumulation
    worst = max(r["fused_over_naive_s"] for r in doc["results"])
    assert doc["targets"]["fused time over naive, worst case"]["value"] == pytest.approx(worst)
    sweep = doc["chunk_sweep"]  # the worst case again at other chunks
    (case,) = [r for r in doc["results"] if r["fused_over_naive_s"] == worst]
    assert sweep["case"] == f"{case['model']} x {case['tokens']}"
    assert sweep["tried"] and all(r["status"] == "ok" and r["fused_s"] > 0 for r in sweep["tried"])
    assert [sweep["backend_chunks"]] + [[r["chunk_tokens"], r["chunk_vocab"]] for r in sweep["tried"]] == \
        [list(p) for p in [(case["chunk_tokens"], case["chunk_vocab"]), *gpu_parts.chunk_candidates(
            case["chunk_tokens"], case["chunk_vocab"], case["tokens"], case["vocab"])]]
    best = min(sweep["tried"], key=lambda r: r["fused_s"])
    assert sweep["best"]["fused_over_naive_s"] == best["fused_over_naive_s"]
    assert dry[1]["parts"]["loss_kernel"]["chunk_sweep"]["best"] == sweep["best"]


def test_the_chunk_sweep_halves_and_doubles_within_the_problem():
    assert gpu_parts.chunk_candidates(4096, 15232, 16384, 152064) == [(8192, 15232), (2048, 15232), (4096, 30464),
                                                                      (4096, 7552)]
    assert gpu_parts.chunk_candidates(256, 5120, 256, 10000) == [(128, 5120), (256, 10000), (256, 2560)]


@pytest.mark.slow
def test_the_publish_part_converts_and_checks_every_tensor(dry):
    doc = part(dry[0], "publish")
    assert doc["gb_per_s"] > 0 and doc["out_bytes"] * 2 == doc["param_bytes"]  # fp32 in, bf16 out
    assert doc["values_checked"] == 3 and doc["buckets"] > 1
    assert doc["full_7b_bytes"] == 16_584_333_312  # Qwen2.5-VL-7B in bf16


def test_the_device_limits_fit_eight_minutes():
    assert sum(p.limit_s for p in PARTS) + MARGIN_S <= 8 * 60


def test_a_part_past_its_limit_is_recorded_and_the_suite_goes_on(tmp_path):
    _, summary = suite(tmp_path, "--dry", "--parts", "publish,train_step,loss_kernel", "--limit", "publish=2",
                       "--limit", "train_step=12", "--cases", "loss_kernel=7B:256", timeout=300)
    publish, train, kernel = (summary["parts"][p] for p in ("publish", "train_step", "loss_kernel"))
    assert publish["status"] == "timed_out" and publish["wall_s"] < 10
    # 12 s leaves under the 10 s a case needs once the margin is off: every case is skipped, on record
    assert train["status"] == "ok"
    assert train["figures"][0]["jax"]["status"] == train["figures"][0]["torch"]["status"] == "skipped: out of time"
    assert all(t["met"] is None for t in train["targets"].values())
    assert kernel["status"] == "ok" and [f["case"] for f in kernel["figures"]] == ["7B x 256"]  # the case named


def test_cases_must_be_a_parts_own():
    out = subprocess.run([sys.executable, "-m", "benchmarks.gpu.gpu_suite", "unused", "--cases", "train_step=3B:99"],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 2 and "3B:8192" in out.stderr


def test_targets_tell_a_miss_from_an_unknown():
    assert gpu_parts.target(0.5, ">= 0.45", lambda v: v >= 0.45)["met"] is True
    assert gpu_parts.target("out of memory", "<= 80", lambda v: v <= 80)["met"] is False
    assert gpu_parts.target("timeout after 120 s", "<= 80", lambda v: v <= 80)["met"] is None
    assert gpu_parts.figure({"status": "ok", "peak_bytes": 3 * 2**30}, "peak_bytes", 2**30) == 3
    assert gpu_parts.figure({"status": "out of memory", "plan_bytes": 1}, "peak_bytes") == "out of memory"


def test_the_driver_never_starts_a_device_backend():
    code = ("import sys, benchmarks.gpu.gpu_suite, benchmarks.gpu.train_step, benchmarks.gpu.vision_tower, "
            "benchmarks.gpu.publish_convert; print(sorted(m for m in ('jax', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_publish_buckets_are_the_publishers():
    from benchmarks.gpu.publish_convert import BUCKET_MB
    from dart_jax.wire.config import WeightSyncConfig

    assert BUCKET_MB == WeightSyncConfig().bucket_mb


def test_build_gives_a_device_command_that_fits_a_call():
    text = (ROOT / "docs/benchmarks.md").read_text()
    section = text.split("## GPU figures: the prepared suite", 1)[1]
    command = re.search(r"```sh\n(.*?)\n```", section, re.S).group(1)
    assert "benchmarks.gpu.gpu_suite $OUT" in command and "/opt/torch/.venv/bin/python3" in command
    assert len(command) <= 2000
