"""The trainer's loops: DART's RL loop on curated batches, and SFT on trajectory files.

    rl_loop(trainer, source, collator, publisher, ckpt, steps, log, budget, log_tasks)
    sft_loop(trainer, source, ckpt, steps, log, budget)

One round of the RL loop: fetch the next curated batch from the data manager, update on it
(`updates_per_batch` optimizer steps: TIS, entropy selection and KL as configured), publish
the new weights (a new policy version), checkpoint when the step count crosses the cadence.
A trainer that waits longer than the source's `max_wait_s` for a batch (the rollouts give
nothing to learn from: every group failed, say) stops early: it records `train/stalled`
and checkpoints at the step it reached, and the run goes on from that policy. A trainer
whose wall-clock `Budget` is spent stops the same way before its next update, or while it
waits for a batch (`train/out_of_time`); both loops honour it.
Step N's metrics are read while step N+1 runs, so the host never waits on the device for
them. A resumed trainer restores the step, the data cursor (the data manager replays the
batches after it) and publishes its restored weights under a new version.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Callable, Iterator

import jax
import numpy as np
from jax.experimental import multihost_utils

from dart_jax.train.batch import TrainBatch
from dart_jax.train.checkpoint import Checkpointer
from dart_jax.train.collate import Collator
from dart_jax.train.precompile import Precompiler
from dart_jax.train.sources import DataManagerSource, NoBatchWithin
from dart_jax.train.publish import WeightPublisher
from dart_jax.train.task_trace import TaskTrace
from dart_jax.train.trainer import Trainer

logger = logging.getLogger(__name__)
Log = Callable[[int, dict], None]  # (step, host metrics)
LogTasks = Callable[[int, tuple[TaskTrace, ...]], None]  # (step, the batch's per-task trace)


@dataclasses.dataclass
class Budget:
    """The wall-clock seconds a training loop may take, counted from its creation (None: no
    limit). On a multi-host trainer process 0's clock decides for every host (one broadcast
    a check), so that all of them stop after the same update."""
    seconds: float | None = None
    start: float = dataclasses.field(default_factory=time.monotonic)

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def ends_at(self) -> float | None:
        """The `time.monotonic()` value at which the budget is spent (None: never)."""
        return None if self.seconds is None else self.start + self.seconds

    def spent(self) -> bool:
        if self.seconds is None:
            return False
        over = self.elapsed() >= self.seconds
        if jax.process_count() > 1:
            over = bool(multihost_utils.broadcast_one_to_all(np.int32(over)))
        return over


def rl_loop(trainer: Trainer, source: DataManagerSource, collator: Collator, publisher: WeightPublisher,
            ckpt: Checkpointer | None, steps: int, log: Log, budget: Budget | None = None,
            log_tasks: LogTasks | None = None) -> None:
    """DART's trainer: fetch a curated batch, update on it, publish the new version, checkpoint;
    until `steps` updates are done, no batch comes within the source's wait, or the budget is
    spent. `log_tasks` gets each batch's per-task trace (host values: written at once)."""
    resume(trainer, source, publisher, ckpt)
    stop, metrics = EarlyStop(trainer, ckpt, source, budget or Budget(), log), Deferred(log)
    source.until = stop.budget.ends_at()  # a batch wait ends with the budget
    ahead = Precompiler(trainer, collator)  # the first wait compiles the update's programs
    if trainer.cfg.precompile and trainer.step < steps:
        ahead.start()
    try:
        while trainer.step < steps and not stop.out_of_time(metrics):
            fetched = time.time()
            try:
                batch = next(source)
            except NoBatchWithin as e:
                stop.no_batch(metrics, e, time.time() - fetched)
                break
            finally:
                ahead.stop()  # the update compiles what the thread has not
            started, before = time.time(), trainer.step
            update = trainer.update_rl(batch, collator)
            if log_tasks is not None:
                log_tasks(trainer.step, trainer.tasks)
            metrics.flush()
            jax.block_until_ready(trainer.state)  # the update's own time ends here, not in the publish
            published = time.time()
            version = publisher.publish(trainer.state.params)
            metrics.defer(trainer.step, update, {
                "batch/id": batch.batch_id, "batch/trajectories": len(batch.trajectories),
                "batch/injected": len(batch.injected), "policy/version": version,
                "time/fetch_start": fetched, "time/update_start": started, "time/publish_start": published,
                "time/publish_end": time.time(), **_staleness(batch, version)})
            _checkpoint(trainer, ckpt, source, before, steps)
    finally:
        ahead.stop()
        ahead.join()  # not a compile left running as the process ends
    _finish(metrics, ckpt)


def sft_loop(trainer: Trainer, source: Iterator[TrainBatch], ckpt: Checkpointer | None, steps: int, log: Log,
             budget: Budget | None = None) -> None:
    """Supervised updates (`accum_steps` batches each) until `steps` are done or the budget is spent."""
    if ckpt is not None and (data_state := trainer.restore(ckpt)) is not None:
        source.set_state(data_state)
    stop, metrics = EarlyStop(trainer, ckpt, source, budget or Budget(), log), Deferred(log)
    while trainer.step < steps and not stop.out_of_time(metrics):
        before = trainer.step
        update = trainer.update_sft([next(source) for _ in range(trainer.cfg.buckets.accum_steps)])
        metrics.flush()
        metrics.defer(trainer.step, update, {})
        _checkpoint(trainer, ckpt, source, before, steps)
    _finish(metrics, ckpt)


class Deferred:
    """Step N's metrics, written while step N+1 runs, so the host never waits on the device."""

    def __init__(self, log: Log):
        self.log, self.pending = log, None

    def defer(self, step: int, device_metrics: dict, host: dict) -> None:
        self.pending = (step, device_metrics, host)

    def flush(self) -> None:
        if self.pending is not None:
            step, device_metrics, host = self.pending
            self.log(step, {k: float(v) for k, v in jax.device_get(device_metrics).items()} | host)
            self.pending = None


@dataclasses.dataclass
class EarlyStop:
    """The two ways a loop ends before its last step, each recorded and checkpointed at the
    step it reached: the budget is spent (`train/out_of_time`), or no batch came within the
    source's wait (`train/stalled`)."""
    trainer: Trainer
    ckpt: Checkpointer | None
    source: object  # get_state(): the data position saved with the checkpoint
    budget: Budget
    log: Log

    def out_of_time(self, metrics: Deferred) -> bool:
        """Whether the budget is spent before the next update (then recorded and saved)."""
        if not self.budget.spent():
            return False
        metrics.flush()
        self.log(self.trainer.step, {"train/out_of_time": 1.0, "train/elapsed_s": self.budget.elapsed()})
        logger.warning("stopping at step %d: %.0f s of the %.0f s budget spent", self.trainer.step,
                       self.budget.elapsed(), self.budget.seconds)
        self._save()
        return True

    def no_batch(self, metrics: Deferred, why: NoBatchWithin, waited_s: float) -> None:
        """A batch wait ended without a batch: the budget ran out during it, or the rollouts
        gave nothing to learn from for the source's whole wait."""
        if self.out_of_time(metrics):
            return
        metrics.flush()
        self.log(self.trainer.step, {"train/stalled": 1.0, "train/waited_s": waited_s})
        logger.warning("stopping at step %d: %s", self.trainer.step, why)
        self._save()

    def _save(self) -> None:
        """The checkpoint of the step an early stop reached, unless a cadence save holds it."""
        if self.ckpt is not None and self.trainer.step > 0 and self.ckpt.latest_step() != self.trainer.step:
            self.trainer.save(self.ckpt, self.source.get_state())


def _checkpoint(trainer: Trainer, ckpt: Checkpointer | None, source, before: int, steps: int) -> None:
    """Save when the update crossed a checkpoint boundary or was the last one."""
    if ckpt is not None and (_crossed(before, trainer.step, trainer.cfg.checkpoint.every_steps) or trainer.step >= steps):
        trainer.save(ckpt, source.get_state())


def _finish(metrics: Deferred, ckpt: Checkpointer | None) -> None:
    """The last update's metrics, and every checkpoint on disk."""
    metrics.flush()
    if ckpt is not None:
        ckpt.wait()


def resume(trainer: Trainer, source: DataManagerSource, publisher: WeightPublisher, ckpt: Checkpointer | None) -> None:
    if ckpt is None or (data_state := trainer.restore(ckpt)) is None:
        return
    source.set_state(data_state)
    # workers may hold versions published after this checkpoint: the restored weights get a new one
    publisher.publish(trainer.state.params)


def _crossed(before: int, after: int, every: int) -> bool:
    """Whether a multiple of `every` lies in (before, after]: no cadence point is skipped
    when one round takes several optimizer steps."""
    return after // every > before // every


def _staleness(batch, version: int) -> dict:
    """Policy version that trains on the batch minus the versions that sampled its steps."""
    versions = [s.policy_version for t in batch.trajectories if t.source == "rollout" for s in t.steps]
    if not versions:
        return {}
    return {"staleness/max": float(version - 1 - min(versions)), "staleness/mean": float(version - 1 - sum(versions) / len(versions))}
