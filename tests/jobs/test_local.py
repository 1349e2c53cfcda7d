import json
import subprocess
import sys

import pytest

from dart_jax.data.pool import read_trajectories


@pytest.mark.slow
def test_local_job_end_to_end(tmp_path):
    """`dart-jax local` as users run it: role processes, demos, pool, run directory."""
    overrides = [f"run.root={tmp_path}", "run.name=e2e", "envs.slots=[{type: synthetic, count: 2}]",
                 "envs.wire.endpoint=tcp://127.0.0.1:25555", "data.wire.endpoint=tcp://127.0.0.1:25557",
                 "job.suites=[{backend: synthetic, names: [click-button, form], train_seeds: 2, eval_seeds: 1}]",
                 "job.demo_concurrency=2"]
    out = subprocess.run([sys.executable, "-m", "dart_jax.cli", "local", "configs/local.yaml", *overrides],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["demo_episodes"] == 4 and summary["demo_successes"] == 4
    assert summary["pool_imported"] == 4 and summary["pool_size"] == 4
    run = tmp_path / "e2e"
    tasks = [json.loads(line) for line in (run / "tasks.jsonl").read_text().splitlines()]
    assert sorted(t["split"] for t in tasks) == ["eval"] * 2 + ["train"] * 4
    demos = list(read_trajectories(run / "data" / "demos"))
    assert {d.task_id.split("/")[2] for d in demos} == {"0", "1"}  # train seeds only
    for role in ("env-server", "data-manager", "local"):
        assert (run / "logs" / f"{role}.log").stat().st_size > 0
    assert json.loads((run / "metrics" / "local.jsonl").read_text())["demo_successes"] == 4
