"""The curation ablation's configurations: each adds one DART piece to plain GRPO, and every
override it writes is a real setting of the run config (the benchmark itself is a command)."""

import dataclasses
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from benchmarks.curation_ablation import PIECES, sft_summary, table, variant
from dart_jax.config.loader import apply_overrides, from_dict
from dart_jax.config.schema import RunConfig
from tests.procs import descendants


def _resolved(base: RunConfig, overrides: list[str]) -> RunConfig:
    return from_dict(RunConfig, apply_overrides(dataclasses.asdict(base), overrides, "test"))


def test_each_configuration_switches_on_one_more_piece():
    base = _resolved(RunConfig(), ["data.curation.max_rollouts=8", "data.curation.default_max_steps=4",
                                   "data.curation.min_steps=3", "data.curation.max_steps=5"])
    got = []
    for _, on in PIECES:
        cfg = _resolved(base, variant(base, on))
        c = cfg.data.curation
        got.append((c.min_rollouts == c.max_rollouts, c.min_steps == c.max_steps == c.default_max_steps,
                    cfg.trainer.selection.enabled, cfg.trainer.tis.enabled, c.experience_pool))
    fixed, plain = (True, True, False, False, False), (False, False, True, True, True)
    assert [label for label, _ in PIECES][0] == "plain GRPO" and got[0] == fixed
    for i in range(1, len(got)):  # piece i switched on, the earlier ones stay on
        assert got[i] == plain[:i] + fixed[i:], (PIECES[i][0], got[i])
    assert got[-1] == plain  # full: every piece on


def test_sft_run_is_read_from_a_finished_run_and_refused_when_it_lacks_the_sft_phases(tmp_path):
    (tmp_path / "metrics").mkdir()
    (tmp_path / "data" / "demos").mkdir(parents=True)
    (tmp_path / "eval").mkdir()
    (tmp_path / "metrics" / "run.jsonl").write_text('{"step": 0, "heldout_succ')  # a run killed mid-write
    with pytest.raises(SystemExit, match="does not end in a JSON summary"):
        sft_summary(tmp_path)
    (tmp_path / "metrics" / "run.jsonl").write_text(json.dumps({"step": 0, "heldout_success_sft": 0.2}) + "\n")
    with pytest.raises(SystemExit, match="sft_export"):
        sft_summary(tmp_path)
    summary = {"step": 0, "heldout_success_sft": 0.2, "sft_export": str(tmp_path / "sft" / "export" / "step-4")}
    with (tmp_path / "metrics" / "run.jsonl").open("a") as f:
        f.write(json.dumps(summary) + "\n")
    with pytest.raises(SystemExit, match="eval/sft.json"):
        sft_summary(tmp_path)
    (tmp_path / "eval" / "sft.json").write_text("{}")
    assert sft_summary(tmp_path) == summary


def test_the_table_says_which_configuration_stopped_for_want_of_batches_or_time():
    row = {"success": 0.5, "ci95": [0.4, 0.6], "gain": 0.1, "gain_ci95": [0.02, 0.18]}
    lines = table([{"config": "plain GRPO", "rl_steps": 30, "stalled": False, "out_of_time": False, **row},
                   {"config": "+ dynamic rollouts", "rl_steps": 5, "stalled": True, "out_of_time": False, **row},
                   {"config": "+ TIS", "rl_steps": 34, "stalled": False, "out_of_time": True, **row}]).splitlines()
    assert "RL steps" in lines[0]
    assert lines[2].split()[2] == "30" and "stalled" not in lines[2] and "time" not in lines[2]
    assert "5 (stalled)" in lines[3]
    assert "34 (time)" in lines[4]


@pytest.mark.slow
def test_a_killed_ablation_takes_its_runs_roles_with_it(tmp_path):
    """SIGTERM to the benchmark (a stalled configuration is killed by hand) unwinds its run:
    the data manager and env server it started are stopped, not left orphaned."""
    root = Path(__file__).resolve().parents[2]
    argv = [sys.executable, "-m", "benchmarks.curation_ablation", "--config", "configs/rl.yaml", "--work", str(tmp_path)]
    proc = subprocess.Popen(argv, cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    roles: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 120
        while len(roles := _roles(proc.pid)) < 2:  # the demos phase: data manager and env server up
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "no data manager and env server in 120 s"
            time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(120)
        gone, alive = psutil.wait_procs(roles, timeout=60)
        assert (code, [p.pid for p in alive]) == (128 + signal.SIGTERM, [])
    finally:  # leave nothing behind for the next test, whatever failed
        for p in [*roles, psutil.Process(proc.pid)] if proc.poll() is None else roles:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass


def _roles(pid: int) -> list[psutil.Process]:
    """The role processes (`dart_jax.cli data-manager|env-server ...`) under process `pid`."""
    out = []
    for p in descendants(pid):
        try:
            if any(role in p.cmdline() for role in ("data-manager", "env-server")):
                out.append(p)
        except psutil.NoSuchProcess:
            continue
    return out
