"""A trainer whose data manager has no batch for it within `trainer.batch_wait_s`, or whose
`trainer.max_seconds` are spent (before an update, or while it waits for a batch), stops early
at the step it reached: it exits cleanly, records `train/stalled` or `train/out_of_time`,
and checkpoints and exports the policy of that step, so a run goes on from it instead of
waiting forever."""

import pytest

from dart_jax.train.config import CheckpointConfig
from dart_jax.train.config import TrainerConfig
from tests.train import dm_store
from tests.train.dm_store import records, train

pytestmark = pytest.mark.slow
WAIT_S = 3.0
BUDGET_S = 1.0
WAITING_BUDGET_S = 40.0  # past the updates 16 rollouts make, short of the batch wait


def _stop_early(tmp_path, tiny_dir, rollouts: int, run: TrainerConfig) -> list[dict]:
    """The metrics records of a trainer run to its end against a store of `rollouts`."""
    dm_store.fill(tmp_path / "store", n=rollouts)
    config, stop = dm_store.rl_trainer(tmp_path, "run", tmp_path / "store", tiny_dir, run,
                                       CheckpointConfig(every_steps=100, async_save=False))
    try:
        proc = train(config)
        assert proc.wait(300) == 0, proc.stderr.read()[-3000:]
    finally:
        stop.set()
    return records(tmp_path / "run")


def test_a_trainer_without_batches_stops_at_its_step_and_exports_that_policy(tmp_path, tiny_dir):
    *updates, last = _stop_early(tmp_path, tiny_dir, 16, TrainerConfig(steps=100, batch_wait_s=WAIT_S))
    assert updates and [r["step"] for r in updates] == list(range(1, len(updates) + 1))
    assert all("train/stalled" not in r for r in updates)
    assert last["step"] == len(updates) < 100
    assert last["train/stalled"] == 1.0 and last["train/waited_s"] >= WAIT_S
    assert (tmp_path / "run" / "checkpoints" / str(len(updates))).is_dir()  # not a cadence step: saved for the stop
    assert (tmp_path / "run" / "export" / f"step-{len(updates)}" / "model.safetensors").is_file()


def test_a_trainer_past_its_budget_stops_before_the_next_update_and_exports_that_policy(tmp_path, tiny_dir):
    # the first update compiles the step (seconds on a CPU): the budget is spent after it
    *updates, last = _stop_early(tmp_path, tiny_dir, 48,
                                 TrainerConfig(steps=100, batch_wait_s=60, max_seconds=BUDGET_S))
    assert updates and [r["step"] for r in updates] == list(range(1, len(updates) + 1))
    assert last["step"] == len(updates) and last["train/out_of_time"] == 1.0
    assert last["train/elapsed_s"] >= BUDGET_S and "train/stalled" not in last
    assert (tmp_path / "run" / "checkpoints" / str(len(updates))).is_dir()
    assert (tmp_path / "run" / "export" / f"step-{len(updates)}" / "model.safetensors").is_file()


def test_a_budget_that_ends_while_the_trainer_waits_for_a_batch_ends_the_wait(tmp_path, tiny_dir):
    *updates, last = _stop_early(tmp_path, tiny_dir, 16,
                                 TrainerConfig(steps=100, batch_wait_s=600, max_seconds=WAITING_BUDGET_S))
    assert updates and last["step"] == len(updates)
    assert last["train/out_of_time"] == 1.0 and "train/stalled" not in last
    assert WAITING_BUDGET_S <= last["train/elapsed_s"] < WAITING_BUDGET_S + 30  # not the 600 s wait
    assert (tmp_path / "run" / "export" / f"step-{len(updates)}" / "model.safetensors").is_file()
