"""Task scheduling for rollout workers: which training task next, how many rollouts, how long.

The next task is the training task with the fewest rollouts pending (in flight on some
worker, or stored unused within the staleness bound), ties broken by the longest time
since it was last handed out, then by task-list order. Its rollout count comes from its
recent success rate and its step limit from its successes' lengths (`curation`). While
every task already has `max_pending_per_task` pending, workers are told to wait, so
rollouts never outrun the trainer by more than that.
"""

from __future__ import annotations

import threading
import time
from collections import deque

from dart_jax.data import curation
from dart_jax.data.config import CurationConfig
from dart_jax.data.store import Store
from dart_jax.wire.messages import NoTask, TaskAssignment, TaskSpec


class Scheduler:
    def __init__(self, store: Store, cfg: CurationConfig, clock=time.monotonic):
        self.store, self.cfg, self.clock = store, cfg, clock
        self.tasks: list[TaskSpec] = store.tasks("train")
        self._inflight: dict[str, deque[list]] = {t.task_id: deque() for t in self.tasks}
        self._last: dict[str, float] = {t.task_id: -1.0 for t in self.tasks}
        self._lock = threading.Lock()

    def next(self, latest_version: int) -> TaskAssignment | NoTask:
        if not self.tasks:
            return NoTask(reason="no training tasks in this run", retry_after_s=30.0)
        unused = self.store.unused_counts(latest_version - self.cfg.max_staleness)
        with self._lock:
            now = self.clock()
            pending = {t.task_id: unused.get(t.task_id, 0) + self._live(t.task_id, now) for t in self.tasks}
            order = {t.task_id: i for i, t in enumerate(self.tasks)}
            task = min(self.tasks, key=lambda t: (pending[t.task_id], self._last[t.task_id], order[t.task_id]))
            if pending[task.task_id] >= self.cfg.max_pending_per_task:
                return NoTask(reason=f"every task has >= {self.cfg.max_pending_per_task} rollouts "
                                     "pending; waiting for the trainer", retry_after_s=1.0)
            n, steps = self.plan(task.task_id)
            self._inflight[task.task_id].append([now + self.cfg.assignment_timeout_s, n])
            self._last[task.task_id] = now
        return TaskAssignment(task=task, num_rollouts=n, max_steps=steps)

    def plan(self, task_id: str) -> tuple[int, int]:
        """(rollout count, step limit) for the task now."""
        s = curation.success_rate(self.store.recent_outcomes(task_id, self.cfg.success_window))
        lengths = self.store.success_lengths(task_id, self.cfg.length_window)
        return curation.rollout_count(s, self.cfg), curation.max_steps(lengths, self.cfg)

    def on_ingested(self, task_id: str) -> None:
        """One rollout of the task arrived: it is no longer in flight."""
        with self._lock:
            live = self._inflight.get(task_id)
            if live:
                live[0][1] -= 1
                if live[0][1] <= 0:
                    live.popleft()

    def _live(self, task_id: str, now: float) -> int:
        live = self._inflight[task_id]
        while live and live[0][0] < now:
            live.popleft()  # expired: the worker died or dropped the assignment
        return sum(n for _, n in live)
