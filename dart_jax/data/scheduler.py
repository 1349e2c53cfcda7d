"""Task scheduling for rollout workers: which training task next, how many rollouts, how long.

The next task is the training task (of the fixed set, with `rl_seeds`) with the fewest rollouts pending (in flight on some
worker, or stored unused within the staleness bound), ties broken by the longest time
since it was last handed out, then by task-list order. Its rollout count comes from its
recent success rate and its step limit from its successes' lengths (`curation`). While
every task already has `max_pending_per_task` pending, or the run has `max_pending` pending
in all, workers are told to wait, so rollouts never outrun the trainer by more than that.

Synchronous mode (`mode="sync"`, DART's non-decoupled baseline) is the same scheduler with
a barrier: a worker gets work only once it runs the newest version; the round of a version
is `tasks_per_batch` tasks, handed out once; the trainer's batch waits until all of the
round's rollouts are in (`round_tasks`), and the next round starts with the next version.

In flight means: handed out in an assignment whose trajectories have not all arrived.
Assignments belong to one life (`session`) of a worker: they return to the pool when the
worker shows up with a new session (it restarted), when it stays silent for
`worker_timeout_s` (no request and no heartbeat), or after `assignment_timeout_s`.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid

from dart_jax.data import curation
from dart_jax.data.config import CurationConfig
from dart_jax.data.store import Store
from dart_jax.wire.messages import NoTask, TaskAssignment, TaskSpec


def scheduled_tasks(store: Store, cfg: CurationConfig) -> list[TaskSpec]:
    """The train tasks rollouts are made of: all, or those with seed < `cfg.rl_seeds`."""
    return [t for t in store.tasks("train") if not cfg.rl_seeds or t.seed < cfg.rl_seeds]


@dataclasses.dataclass
class Assignment:
    id: str
    task_id: str
    worker_id: str
    session: str
    remaining: int
    expires: float


@dataclasses.dataclass
class Round:
    """The synchronous round of one policy version: its tasks, in the order handed out."""
    version: int
    tasks: list[str]


class Scheduler:
    def __init__(self, store: Store, cfg: CurationConfig, clock=time.monotonic, mode: str = "async"):
        self.store, self.cfg, self.clock, self.mode = store, cfg, clock, mode
        self.round = Round(0, [])
        self.tasks: list[TaskSpec] = scheduled_tasks(store, cfg)
        self._assignments: dict[str, Assignment] = {}
        self._sessions: dict[str, tuple[str, float]] = {}  # worker_id -> (session, last seen)
        self._last: dict[str, float] = {t.task_id: -1.0 for t in self.tasks}
        self._lock = threading.Lock()

    def next(self, latest_version: int, worker_id: str = "", session: str = "",
             worker_version: int | None = None) -> TaskAssignment | NoTask:
        if not self.tasks:
            return NoTask(reason="no training tasks in this run", retry_after_s=30.0)
        unused = self.store.unused_counts(latest_version - self.cfg.max_staleness)
        with self._lock:
            now = self.clock()
            self._seen(worker_id, session, now)
            if self.mode == "sync" and (waiting := self._barrier(latest_version, worker_version)):
                return waiting
            live = self._in_flight(now)
            pending = {t.task_id: unused.get(t.task_id, 0) + live.get(t.task_id, 0) for t in self.tasks}
            order = {t.task_id: i for i, t in enumerate(self.tasks)}
            task = min(self.tasks, key=lambda t: (pending[t.task_id], self._last[t.task_id], order[t.task_id]))
            if pending[task.task_id] >= self.cfg.max_pending_per_task:
                return NoTask(reason=f"every task has >= {self.cfg.max_pending_per_task} rollouts "
                                     "pending; waiting for the trainer", retry_after_s=1.0)
            if self.cfg.max_pending and (total := self._trainable(pending, live, latest_version)) >= self.cfg.max_pending:
                return NoTask(reason=f"{total} rollouts pending (max_pending {self.cfg.max_pending}); "
                                     "waiting for the trainer", retry_after_s=1.0)
            n, steps = self.rollout_budget(task.task_id)
            assignment = Assignment(uuid.uuid4().hex, task.task_id, worker_id, session, n,
                                    now + self.cfg.assignment_timeout_s)
            self._assignments[assignment.id] = assignment
            self._last[task.task_id] = now
            if self.mode == "sync":
                self.round.tasks.append(task.task_id)
        return TaskAssignment(task=task, num_rollouts=n, max_steps=steps, assignment_id=assignment.id)

    def _trainable(self, pending: dict[str, int], live: dict[str, int], latest_version: int) -> int:
        """Pending rollouts that count against `max_pending`: all in flight, and the unused ones
        of tasks that can form a group. A task still waiting for a success (without the
        experience pool) or for a failure (all its rollouts succeeded) holds none back: its
        rollouts wait for more of their task, and counting them would stall the run once a
        good policy has left `max_pending` of them, the trainer waiting for groups and the
        workers for the trainer."""
        waiting = self.store.waiting_tasks(latest_version - self.cfg.max_staleness, self.cfg.experience_pool,
                                           all_success_waits=not self.cfg.keep_all_success_groups)
        return sum(live.get(t, 0) if t in waiting else n for t, n in pending.items())

    def _barrier(self, latest_version: int, worker_version: int | None) -> NoTask | None:
        """Why a synchronous worker must wait now, or None when it gets the round's next task."""
        if worker_version is not None and worker_version < latest_version:
            return NoTask(reason=f"sync to version {latest_version} first", retry_after_s=0.2)
        if self.round.version != latest_version:
            self.round = Round(latest_version, [])
        if len(self.round.tasks) >= min(self.cfg.tasks_per_batch, len(self.tasks)):
            return NoTask(reason=f"the round of version {latest_version} is handed out; waiting for the trainer",
                          retry_after_s=0.2)
        return None

    def round_tasks(self, version: int) -> list[str] | None:
        """The tasks of version `version`'s round once it is complete: all handed out and
        nothing of it in flight. None while it is rolling out."""
        with self._lock:
            live = self._in_flight(self.clock())
            full = len(self.round.tasks) >= min(self.cfg.tasks_per_batch, len(self.tasks))
            if self.round.version != version or not full or any(live.get(t) for t in self.round.tasks):
                return None
            return list(self.round.tasks)

    def restart_round(self) -> None:
        """The round gave nothing to train on (every rollout failed in its env): roll it again."""
        with self._lock:
            self.round = Round(self.round.version, [])

    def rollout_budget(self, task_id: str) -> tuple[int, int]:
        """(rollout count, step limit) for the task now."""
        s = curation.success_rate(self.store.recent_outcomes(task_id, self.cfg.success_window))
        lengths = self.store.success_lengths(task_id, self.cfg.length_window)
        return curation.rollout_count(s, self.cfg), curation.max_steps(lengths, self.cfg)

    def heartbeat(self, worker_id: str, session: str) -> bool:
        """A worker is alive; True when this session holds assignments."""
        with self._lock:
            self._seen(worker_id, session, self.clock())
            return any(a.session == session and a.worker_id == worker_id for a in self._assignments.values())

    def on_ingested(self, task_id: str, assignment_id: str = "") -> None:
        """One rollout arrived: one fewer in flight (of its assignment, else the task's oldest)."""
        with self._lock:
            a = self._assignments.get(assignment_id) or next(
                (a for a in self._assignments.values() if a.task_id == task_id), None)
            if a is not None and a.task_id == task_id:
                a.remaining -= 1
                if a.remaining <= 0:
                    del self._assignments[a.id]

    def in_flight(self) -> dict[str, int]:
        """Rollouts in flight per task (for stats)."""
        with self._lock:
            return self._in_flight(self.clock())

    def _seen(self, worker_id: str, session: str, now: float) -> None:
        if not worker_id:
            return
        old = self._sessions.get(worker_id)
        if old is not None and old[0] != session:  # the worker restarted: its old life's work is void
            self._drop(lambda a: a.worker_id == worker_id and a.session == old[0])
        self._sessions[worker_id] = (session, now)

    def _in_flight(self, now: float) -> dict[str, int]:
        silent = {w for w, (_, seen) in self._sessions.items() if now - seen > self.cfg.worker_timeout_s}
        self._drop(lambda a: a.expires < now or a.worker_id in silent)
        live: dict[str, int] = {}
        for a in self._assignments.values():
            live[a.task_id] = live.get(a.task_id, 0) + a.remaining
        return live

    def _drop(self, doomed) -> None:
        for a in [a for a in self._assignments.values() if doomed(a)]:
            del self._assignments[a.id]
