"""RL resume end to end: a trainer killed mid-run and started again trains on the same
curated batches, with the same losses, as a trainer that was never interrupted.

Two data managers start from copies of one store (rollouts of two tasks, both outcomes);
trainer A runs `dart-jax train` uninterrupted, trainer B is SIGKILLed after a checkpoint
and started again. The data manager replays every batch it handed out after B's cursor,
so B's steps after its checkpoint see A's batches.
"""

import json
import signal
import subprocess
import sys
import time

import pytest

from dart_jax.config import dump
from dart_jax.run.schema import PolicySection, RunConfig, RunSection
from dart_jax.train.config import BucketConfig, CheckpointConfig, OptimizerConfig, TrainerConfig
from dart_jax.train.main import TrainRunConfig
from dart_jax.wire import WireConfig
from dart_jax.wire.weights import WeightSyncConfig
from tests.train import dm_store

pytestmark = pytest.mark.slow
STEPS, EVERY = 6, 2


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("store")
    dm_store.fill(root)
    return root


def _start(tmp_path, name: str, store, tiny_dir):
    """A data manager on a copy of `store`, and the config of a trainer against it."""
    root = tmp_path / name
    dm, stop = dm_store.serve_copy(store, root)
    loop = WireConfig(endpoint="tcp://127.0.0.1:0")
    cfg = RunConfig(run=RunSection(name=name, root=str(tmp_path)), policy=PolicySection(hf_dir=str(tiny_dir)),
                    data=dm, weights=WeightSyncConfig(announce=loop, serve=loop),
                    trainer=TrainerConfig(mode="rl", optimizer=OptimizerConfig(lr=1e-4),
                                          buckets=BucketConfig((128, 256), (64,), 4),
                                          checkpoint=CheckpointConfig(every_steps=EVERY, async_save=False)),
                    train=TrainRunConfig(steps=STEPS, export=False))
    path = root / "trainer.yaml"
    path.write_text(dump(cfg))
    return path, stop


def _train(config) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "dart_jax.cli", "train", str(config)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _records(root) -> list[dict]:
    path = root / "metrics" / "trainer.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_killed_rl_trainer_resumes_on_the_same_batches_with_the_same_losses(tmp_path, store, tiny_dir):
    whole_cfg, stop_a = _start(tmp_path, "whole", store, tiny_dir)
    killed_cfg, stop_b = _start(tmp_path, "killed", store, tiny_dir)
    try:
        whole, killed = _train(whole_cfg), _train(killed_cfg)
        deadline = time.monotonic() + 600
        while not (tmp_path / "killed" / "checkpoints" / str(EVERY * 2)).exists():
            assert killed.poll() is None and time.monotonic() < deadline, killed.stderr.read()[-3000:]
            time.sleep(0.2)
        killed.send_signal(signal.SIGKILL)
        killed.wait()
        before = _records(tmp_path / "killed")
        resumed = _train(killed_cfg)
        assert resumed.wait(600) == 0, resumed.stderr.read()[-3000:]
        assert whole.wait(600) == 0, whole.stderr.read()[-3000:]
    finally:
        stop_a.set()
        stop_b.set()
    reference = {r["step"]: r for r in _records(tmp_path / "whole")}
    assert sorted(reference) == list(range(1, STEPS + 1))
    after = _records(tmp_path / "killed")
    for r in after:  # every step, before the kill and after the restart
        assert r["batch/id"] == reference[r["step"]]["batch/id"], r["step"]
        assert r["loss/policy"] == pytest.approx(reference[r["step"]]["loss/policy"], abs=1e-6), r["step"]
    assert [r["step"] for r in after[len(before):]] == list(range(EVERY * 2 + 1, STEPS + 1))  # from step 4's checkpoint
    versions = [r["policy/version"] for r in after]
    assert versions == sorted(versions) and len(set(versions)) == len(versions)  # a restart never reuses one
