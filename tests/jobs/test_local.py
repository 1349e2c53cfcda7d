import json
import subprocess
import sys

import pytest

from dart_jax.data.pool import read_trajectories


@pytest.mark.slow
def test_local_job_end_to_end(tmp_path):
    """`dart-jax local` as users run it: role processes, demos, pool, run directory."""
    # ipc endpoints in the test's own directory: no port another test or user could hold
    overrides = [f"run.root={tmp_path}", "run.name=e2e", "envs.slots=[{type: synthetic, count: 2}]",
                 f"envs.wire.endpoint=ipc://{tmp_path}/envs.sock", f"data.wire.endpoint=ipc://{tmp_path}/dm.sock",
                 "job.suites=[{backend: synthetic, names: [click-button, form], train_seeds: 2, eval_seeds: 1}]",
                 "job.demo_concurrency=2", "train.steps=4", "trainer.checkpoint.every_steps=2",
                 "trainer.buckets.seq_lens=[1024, 2048]", "trainer.buckets.num_slots=[1024, 2048]"]
    out = subprocess.run([sys.executable, "-m", "dart_jax.cli", "local", "configs/local.yaml", *overrides],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["demo_episodes"] == 6 and summary["demo_successes"] == 6  # 4 train + 2 eval
    assert summary["pool_imported"] == 4 and summary["pool_size"] == 4
    run = tmp_path / "e2e"
    tasks = [json.loads(line) for line in (run / "tasks.jsonl").read_text().splitlines()]
    assert sorted(t["split"] for t in tasks) == ["eval"] * 2 + ["train"] * 4
    demos = list(read_trajectories(run / "data" / "demos"))
    assert {d.task_id.split("/")[2] for d in demos} == {"0", "1"}  # train seeds only
    assert {d.task_id.split("/")[2] for d in read_trajectories(run / "data" / "eval_demos")} == {"10000"}
    for role in ("env-server", "data-manager", "trainer", "local"):
        assert (run / "logs" / f"{role}.log").stat().st_size > 0
    # SFT ran in the trainer's process, checkpointed, exported, and learned something held out.
    assert summary["sft_steps"] == 4 and summary["sft_nll_last"] < summary["sft_nll_first"]
    assert summary["eval_nll_after"] < summary["eval_nll_before"]
    assert (run / "export" / "step-4" / "config.json").exists()
    assert sorted(p.name for p in (run / "checkpoints").iterdir() if p.name.isdigit()) == ["2", "4"]
    assert json.loads((run / "metrics" / "local.jsonl").read_text())["demo_successes"] == 6
    again = subprocess.run([sys.executable, "-m", "dart_jax.cli", "local", "configs/local.yaml", *overrides],
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and again.stderr.count("\n") == 1
    assert "run.name: run directory" in again.stderr and "exists" in again.stderr
