"""DART's adaptive curation rules: pure functions over typed trajectory records.

The store turns rows into `TrajRecord`s; everything here is deterministic arithmetic on
them, so each rule is tested with exact expected outcomes (tests/data/test_curation.py).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Iterable, Sequence

from dart_jax.data.config import CurationConfig


@dataclasses.dataclass(frozen=True)
class TrajRecord:
    """What curation needs to know about a stored trajectory. `seq` is the ingest order."""
    traj_id: str
    task_id: str
    seq: int
    success: bool
    num_steps: int
    min_version: int  # oldest policy version among its steps (staleness counts from it)
    max_version: int


@dataclasses.dataclass(frozen=True)
class Group:
    """One GRPO group: the task's trajectories for one batch, in order."""
    task_id: str
    members: tuple[TrajRecord, ...]
    injected: tuple[str, ...] = ()  # traj_ids taken from the experience pool


def success_rate(outcomes: Sequence[bool]) -> float:
    """s = successes / attempts over the recent window; 0 before any attempt."""
    return sum(outcomes) / len(outcomes) if outcomes else 0.0


def rollout_count(s: float, cfg: CurationConfig) -> int:
    """Rollouts to run for a task with recent success rate s (DART's dynamic rollouts).

        n(s) = max_rollouts                                            if s < low_success
        n(s) = clamp(floor(numerator / s - offset), min_rollouts, max_rollouts)  otherwise

    Defaults (0.6, 9, 7, 1, 8): 0.6 -> 8, 0.7 -> 5, 0.8 -> 4, 0.9 -> 3, 1.0 -> 2.
    """
    if s < cfg.low_success:
        return cfg.max_rollouts
    # The epsilon keeps exact table values exact: 9 / 0.9 - 7 is 2.9999999999999996 in floats.
    n = math.floor(cfg.numerator / s - cfg.offset + 1e-9)
    return max(cfg.min_rollouts, min(cfg.max_rollouts, n))


def percentile_nearest_rank(values: Sequence[int], p: float) -> int:
    """The nearest-rank p-th percentile: sorted(values)[ceil(p / 100 * n) - 1]."""
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered) - 1e-9))
    return ordered[rank - 1]


def max_steps(success_lengths: Sequence[int], cfg: CurationConfig) -> int:
    """Step limit for a task's next episodes, from the lengths of its recent successes.

        L = clamp(P_p(lengths) + margin, min_steps, max_steps)   (nearest-rank percentile)
        L = default_max_steps                                     before any success
    """
    if not success_lengths:
        return cfg.default_max_steps
    value = percentile_nearest_rank(success_lengths, cfg.length_percentile) + cfg.length_margin
    return max(cfg.min_steps, min(cfg.max_steps, value))


def is_fresh(rec: TrajRecord, trainer_version: int, max_staleness: int) -> bool:
    """Within the staleness bound: trainer_version - rec.min_version <= max_staleness.

    With max_staleness 1 a trainer at version V trains on data from versions V and V-1
    (DART's "latest 2 policy versions"). Every step of the trajectory must qualify.
    """
    return trainer_version - rec.min_version <= max_staleness


def trim_group(members: Sequence[TrajRecord], size: int) -> list[TrajRecord]:
    """At most `size` members, keeping >= 1 success and >= 1 failure where present.

    The first success and the first failure (in the given order) are reserved; the
    remaining `size - reserved` slots go to the others in order; the result keeps the
    given order. Callers order members oldest first, so data is used before it goes stale.
    """
    if len(members) <= size:
        return list(members)
    reserved = {id(m) for m in (_first(members, True), _first(members, False)) if m is not None}
    free = size - len(reserved)
    chosen = []
    for m in members:
        if id(m) in reserved:
            chosen.append(m)
        elif free > 0:
            chosen.append(m)
            free -= 1
    return chosen


def _first(members: Iterable[TrajRecord], success: bool) -> TrajRecord | None:
    return next((m for m in members if m.success == success), None)


def round_group(task_id: str, fresh: Sequence[TrajRecord], pool: Sequence[TrajRecord],
                cfg: CurationConfig) -> Group:
    """A synchronous round's group: every rollout of the round, never waiting (the round is
    all the data there is until the next version). A group without a success gets one
    from `pool` where there is one (else it trains with zero advantage), then `trim_group`."""
    members, injected = list(fresh), ()
    extra = next((p for p in pool if p.success), None)
    if not any(m.success for m in members) and extra is not None:
        members, injected = [extra, *members], (extra.traj_id,)
    return Group(task_id, tuple(trim_group(members, cfg.group_size)), injected)


def form_group(task_id: str, fresh: Sequence[TrajRecord], pool: Sequence[TrajRecord],
               need: int, cfg: CurationConfig) -> Group | None:
    """The task's group, or None while the task must wait.

    - `fresh`: its unused trajectories within the staleness bound, oldest first; the task
      waits until there are min(need, group_size) of them (`need` is its rollout count).
    - No success among them: the newest success in `pool` (newest first) that is not
      already a member is injected; with none, the task waits.
    - No failure: the group has zero advantage everywhere; it waits for a failure unless
      `keep_all_success_groups`.
    - Then `trim_group` to group_size (an injected success is the reserved success).
    """
    if len(fresh) < min(need, cfg.group_size) or not fresh:
        return None
    members, injected = list(fresh), ()
    if not any(m.success for m in members):
        ids = {m.traj_id for m in members}
        extra = next((p for p in pool if p.success and p.traj_id not in ids), None)
        if extra is None:
            return None
        members = [extra, *members]  # first, so trimming reserves it as the success
        injected = (extra.traj_id,)
    if all(m.success for m in members) and not cfg.keep_all_success_groups:
        return None
    return Group(task_id, tuple(trim_group(members, cfg.group_size)), injected)


def select_groups(fresh_by_task: dict[str, Sequence[TrajRecord]],
                  pool_by_task: dict[str, Sequence[TrajRecord]],
                  need_by_task: dict[str, int], tasks_needed: int,
                  cfg: CurationConfig) -> list[Group] | None:
    """`tasks_needed` groups for one batch, or None until that many tasks are ready.

    Ready groups are taken in order of their oldest member (first come, first trained),
    ties by task id.
    """
    groups = []
    for task_id in sorted(fresh_by_task):
        g = form_group(task_id, fresh_by_task[task_id], pool_by_task.get(task_id, ()),
                       need_by_task.get(task_id, cfg.max_rollouts), cfg)
        if g is not None:
            groups.append(g)
    if len(groups) < tasks_needed:
        return None
    groups.sort(key=lambda g: (min(m.seq for m in g.members if m.traj_id not in g.injected), g.task_id))
    return groups[:tasks_needed]
