"""The training loops' wall-clock budget (`trainer.max_seconds`): a loop whose budget is spent
stops before its next update, records `train/out_of_time` at the step it reached and
checkpoints that step; without a budget it runs its steps."""

import dataclasses
import time

from dart_jax.train import loop


@dataclasses.dataclass
class FakeTrainer:
    """An SFT trainer whose update takes `update_s` seconds."""
    update_s: float
    step: int = 0
    saved: list = dataclasses.field(default_factory=list)
    cfg: object = dataclasses.field(default_factory=lambda: _Cfg())

    def restore(self, ckpt):
        return None

    def update_sft(self, batches):
        time.sleep(self.update_s)
        self.step += 1
        return {"loss/nll": 1.0 / self.step}

    def save(self, ckpt, data_state):
        ckpt.steps.append(self.step)
        self.saved.append(data_state)


@dataclasses.dataclass
class _Buckets:
    accum_steps: int = 1


@dataclasses.dataclass
class _Checkpoint:
    every_steps: int = 100


@dataclasses.dataclass
class _Cfg:
    buckets: _Buckets = dataclasses.field(default_factory=_Buckets)
    checkpoint: _Checkpoint = dataclasses.field(default_factory=_Checkpoint)


class FakeCheckpointer:
    def __init__(self):
        self.steps: list[int] = []

    def latest_step(self):
        return self.steps[-1] if self.steps else None

    def wait(self):
        pass


class Batches:
    def __init__(self):
        self.taken = 0

    def __next__(self):
        self.taken += 1
        return self.taken

    def get_state(self):
        return {"taken": self.taken}


def _sft(steps: int, update_s: float, budget: loop.Budget | None):
    trainer, ckpt, records = FakeTrainer(update_s), FakeCheckpointer(), []
    loop.sft_loop(trainer, Batches(), ckpt, steps, lambda step, values: records.append((step, values)), budget)
    return trainer, ckpt, records


def test_without_a_budget_every_step_runs():
    trainer, ckpt, records = _sft(5, 0.0, None)
    assert trainer.step == 5 and [s for s, _ in records] == [1, 2, 3, 4, 5]
    assert ckpt.steps == [5] and not any("train/out_of_time" in v for _, v in records)


def test_a_spent_budget_stops_before_the_next_update_and_checkpoints_the_step_reached():
    trainer, ckpt, records = _sft(1000, 0.05, loop.Budget(0.2))
    assert 4 <= trainer.step < 1000  # 0.2 s of 0.05 s updates: the check before each update ends it
    *updates, (step, last) = records
    assert [s for s, _ in updates] == list(range(1, trainer.step + 1))
    assert step == trainer.step and last["train/out_of_time"] == 1.0 and last["train/elapsed_s"] >= 0.2
    assert ckpt.steps == [trainer.step] and trainer.saved == [{"taken": trainer.step}]


def test_a_budget_spent_before_the_first_update_trains_nothing_and_saves_nothing():
    trainer, ckpt, records = _sft(10, 0.0, loop.Budget(1e-9))
    assert trainer.step == 0 and ckpt.steps == []
    [(step, values)] = records
    assert step == 0 and values["train/out_of_time"] == 1.0


def test_budget_counts_from_its_creation():
    budget = loop.Budget(0.1)
    assert not budget.spent()
    time.sleep(0.12)
    assert budget.spent() and budget.elapsed() >= 0.1
    assert not loop.Budget(None).spent()
