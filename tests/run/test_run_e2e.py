"""`dart-jax run` as a user runs it: every role its own process, the whole decoupled loop,
and each role killed once (kill -9) while it runs.

One run (configs/rl.yaml made small): the experience pool from oracle demonstrations, one
vLLM CPU rollout worker, synthetic env slots, the data manager and the RL trainer. While it
runs, each role is SIGKILLed once, two at a time as the trainer publishes versions: after
version 1 the env server and the data manager (the worker and the trainer, still up, must
reconnect to both), after version 2 the rollout worker and the trainer (the restarted worker
must pull the restarted trainer's weights). Two restarts at once overlap the two slow ones
(the engine and the train step's compilation) instead of queueing them. The run must finish
with every role restarted, the trainer resumed from its last checkpoint, no acknowledged
trajectory lost or stored twice, every published version reaching the worker, and the plots
on disk.
"""

import json
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from dart_jax.run.launchers.shm_ledger import mapped_segments
from dart_jax.wire.process_groups import group_pids, signal_group
from tests.stores import content_duplicates, stored_ids

pytestmark = [pytest.mark.slow, pytest.mark.vllm]
ROOT = Path(__file__).resolve().parents[2]
STEPS = 4


def _overrides(tmp: Path) -> list[str]:
    sock = lambda name: f"ipc://{tmp}/{name}.sock"  # noqa: E731: no port another test could hold
    return [f"run.root={tmp}", "run.name=e2e", "run.view=lines", "run.heartbeat_s=1",
            f"envs.wire.endpoint={sock('envs')}", f"data.wire.endpoint={sock('dm')}",
            f"weights.announce.endpoint={sock('announce')}", f"weights.serve.endpoint={sock('weights')}",
            "envs.slots=[{type: synthetic, count: 4}]",
            "tasks.suites=[{backend: synthetic, names: [click-button, enter-text], train_seeds: 3, eval_seeds: 1}]",
            "data.curation.tasks_per_batch=2", "data.curation.default_max_steps=3", "data.curation.max_steps=3",
            "rollout.episodes=4", "rollout.sampling.max_tokens=24", "rollout.engine.max_model_len=4096",
            "trainer.buckets.seq_lens=[1024, 2048]", "trainer.buckets.num_slots=[2048, 4096]",
            "trainer.checkpoint.every_steps=1", f"trainer.steps={STEPS}"]


def _role_pid(run: Path, role: str) -> int:
    config = str(run / "roles" / f"{role}.yaml")
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if config in (proc.info["cmdline"] or []):
            return proc.info["pid"]
    raise LookupError(f"no process runs {config}")


def _version(run: Path) -> int:
    path = run / "metrics" / "trainer.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return max((json.loads(line).get("policy/version", 0) for line in lines), default=0)


def _kill_when(run: Path, proc, version: int, roles: tuple[str, ...], held: set[str]) -> int:
    """SIGKILL `roles` once the trainer published `version`, adding the shared memory their
    groups mapped to `held`; returns the trainer's last step then."""
    deadline = time.monotonic() + 900
    while _version(run) < version:
        assert proc.poll() is None, f"the run ended early: {proc.stderr.read()[-3000:]}"
        assert time.monotonic() < deadline, f"no version {version} in 900 s"
        time.sleep(1)
    pids = [_role_pid(run, role) for role in roles]
    for pid in pids:
        held |= mapped_segments(group_pids(pid))
    for pid in pids:
        signal_group(pid, signal.SIGKILL)  # the role and its children (a worker's engine)
    return max(json.loads(line)["step"] for line in (run / "metrics" / "trainer.jsonl").read_text().splitlines())


def _resumed_at(run: Path) -> list[int]:
    """The steps the trainer said it resumed at (its JSON log, across restarts)."""
    lines = [json.loads(line) for line in (run / "logs" / "trainer.log").read_text().splitlines()]
    return [int(m["message"].split()[3]) for m in lines if m["message"].startswith("resumed at step ")]


def test_the_whole_loop_survives_each_role_killed_once(tmp_path):
    run = tmp_path / "e2e"
    proc = subprocess.Popen([sys.executable, "-m", "dart_jax.cli", "run", "configs/rl.yaml", *_overrides(tmp_path)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    held: set[str] = set()
    try:
        for version, roles in ((1, ("env-server", "data-manager")), (2, ("rollout", "trainer"))):
            last_step = _kill_when(run, proc, version, roles, held)
        out, err = proc.communicate(timeout=1200)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(60)
    assert proc.returncode == 0, err[-4000:]
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["rl_steps"] == STEPS and summary["policy_versions"] >= STEPS
    assert summary["restarts"] == {"env-server": 1, "rollout": 1, "data-manager": 1, "trainer": 1}
    assert all(Path(p).stat().st_size > 10_000 for p in summary["plots"])
    # the killed worker's vLLM ring buffers did not outlive it (the launcher's SegmentLedger)
    assert held and not [p for p in held if Path(p).exists()], held
    # the killed trainer resumed from its last checkpoint (one a step), not from step 0: at the
    # step it last logged or, if that save was still in flight, the one before; and it went on
    # from there (every step logged after the restart comes after it)
    [resumed] = _resumed_at(run)
    assert 1 <= last_step - 1 <= resumed <= last_step, (resumed, last_step)
    steps = [json.loads(line)["step"] for line in (run / "metrics" / "trainer.jsonl").read_text().splitlines()]
    after = steps[steps.index(last_step) + 1:]
    assert after and after[0] == resumed + 1 and after == sorted(after), steps
    # nothing acknowledged was lost, and no episode was stored twice (by content: task and tokens)
    store = run / "data" / "store.sqlite"
    acked = [json.loads(line)["traj"] for line in (run / "metrics" / "rollout-rollout-0.jsonl").read_text().splitlines()
             if '"traj"' in line]
    assert acked and set(acked) <= set(stored_ids(store))
    assert content_duplicates(store) == []
    # the worker took the trainer's versions (the ones published while it was up)
    synced = {json.loads(line)["sync_version"] for line in
              (run / "metrics" / "rollout-rollout-0.jsonl").read_text().splitlines() if "sync_version" in line}
    assert len(synced) >= STEPS - 2
    db = sqlite3.connect(f"file:{store}?mode=ro", uri=True)
    assert db.execute("SELECT count(*) FROM batches").fetchone()[0] >= STEPS
    for role in ("env-server", "rollout", "data-manager", "trainer"):
        assert f"{role} exited with code -9" in err, role
