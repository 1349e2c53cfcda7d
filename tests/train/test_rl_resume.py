"""RL resume end to end: a trainer killed mid-run and started again trains on the same
curated batches, with the same losses, as a trainer that was never interrupted.

Two data managers start from copies of one store (rollouts of two tasks, both outcomes);
trainer A runs `dart-jax train` uninterrupted, trainer B is SIGKILLed after a checkpoint
and started again. The data manager replays every batch it handed out after B's cursor,
so B's steps after its checkpoint see A's batches.
"""


import pytest

from dart_jax.train.config import CheckpointConfig
from dart_jax.train.config import TrainRunConfig
from tests.train import dm_store
from tests.train.dm_store import records, train
from tests.procs import kill_when

pytestmark = pytest.mark.slow
STEPS, EVERY = 6, 2


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("store")
    dm_store.fill(root)
    return root


def _start(tmp_path, name: str, store, tiny_dir):
    return dm_store.rl_trainer(tmp_path, name, store, tiny_dir, TrainRunConfig(steps=STEPS, export=False),
                               CheckpointConfig(every_steps=EVERY, async_save=False))


def test_a_killed_rl_trainer_resumes_on_the_same_batches_with_the_same_losses(tmp_path, store, tiny_dir):
    whole_cfg, stop_a = _start(tmp_path, "whole", store, tiny_dir)
    killed_cfg, stop_b = _start(tmp_path, "killed", store, tiny_dir)
    try:
        whole, killed = train(whole_cfg), train(killed_cfg)
        kill_when(killed, lambda: (tmp_path / "killed" / "checkpoints" / str(EVERY * 2)).exists())
        before = records(tmp_path / "killed")
        resumed = train(killed_cfg)
        assert resumed.wait(600) == 0, resumed.stderr.read()[-3000:]
        assert whole.wait(600) == 0, whole.stderr.read()[-3000:]
    finally:
        stop_a.set()
        stop_b.set()
    reference = {r["step"]: r for r in records(tmp_path / "whole")}
    assert sorted(reference) == list(range(1, STEPS + 1))
    after = records(tmp_path / "killed")
    for r in after:  # every step, before the kill and after the restart
        assert r["batch/id"] == reference[r["step"]]["batch/id"], r["step"]
        assert r["loss/policy"] == pytest.approx(reference[r["step"]]["loss/policy"], abs=1e-6), r["step"]
    assert [r["step"] for r in after[len(before):]] == list(range(EVERY * 2 + 1, STEPS + 1))  # from step 4's checkpoint
    versions = [r["policy/version"] for r in after]
    assert versions == sorted(versions) and len(set(versions)) == len(versions)  # a restart never reuses one
