"""Whether RL is learning or collapsing, from the training rollouts a run recorded.

    curve = success_curve(records.trajectories)    # success of the last 256 train rollouts, per rollout
    collapse = detect_collapse(records.trajectories)  # None, or where it fell (the rule below)
    low = lowest_after(curve, level=0.436)         # its lowest point once it first reached `level`

The curve runs over train-task rollouts in ingest order, env errors left out, from the
WINDOW-th rollout on. Each point carries the newest policy version among the steps of its
last rollout. The collapse rule (issue 42; a run that falls and recovers has still collapsed):

- a fall: a window at or below (1 - FALL) = 0.65 of the best window before it (a 35% fall);
- a late collapse: the rollouts of the last TAIL_VERSIONS = 2 policy versions (at least
  TAIL_MIN rollouts) below half of the best window. A window of 256 rollouts spans about
  three versions of `make run`, so a collapse in the run's last one or two versions barely
  moves it; the tail is judged on its own rollouts;
- either way only by at least MIN_DROP = 0.10 of all rollouts below the best window. At low
  success a 35% fall is within a window's noise: a curation probe (harder tasks) went from a
  best window of 0.160 to 0.102 and then climbed to 0.23 (its rollouts arrive in groups of a
  task, about 30 independent draws a window, a standard error of 0.065 at 0.16). Where the
  best window is 0.286 or more, 35% is at least 0.10 and the floor changes nothing.

Why 256 rollouts (about three policy versions of `make run`): a task's rollouts arrive
together and share its difficulty (click-test's nearly all fail), so a window holds fewer
independent draws than rollouts. Over one run that held 0.58-0.78 success per five versions
and never fell, windows of 64 rollouts ranged from 0.375 to 0.984 (a false collapse), of 128
from 0.52 to 0.90, of 256 from 0.55 to 0.84: 0.65 of the best is just below that run's
lowest window, and the tail's looser half (its 64-150 rollouts are noisier) keeps the rule
from calling that run collapsed.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from dart_jax.observe.records import TrajectoryTiming

WINDOW = 256
FALL = 0.35  # a window this far below the best before it is a collapse
TAIL_VERSIONS = 2  # the last versions judged on their own rollouts
TAIL_MIN = 64  # fewer rollouts than this in them: too few to judge
MIN_DROP = 0.10  # a fall or a late collapse is at least this far below the best window


@dataclasses.dataclass(frozen=True)
class SuccessPoint:
    version: int  # newest sampling version of the window's last rollout (-1: no steps)
    success: float  # mean success of the window's rollouts


@dataclasses.dataclass(frozen=True)
class Collapse:
    version: int  # where the rule first held
    success: float  # the fallen window's (or the tail's) success
    best: float  # the best window before it
    best_version: int
    late: bool = False  # found in the last versions' own rollouts (the tail), not a window


def train_rollouts(trajs: Sequence[TrajectoryTiming]) -> list[TrajectoryTiming]:
    """Rollouts of train tasks in the given (ingest) order, env errors left out."""
    return [t for t in trajs if t.source == "rollout" and t.split == "train" and t.status != "env_error"]


def success_curve(trajs: Sequence[TrajectoryTiming], window: int = WINDOW) -> list[SuccessPoint]:
    """The rolling success of the last `window` train rollouts, one point per rollout from the
    window-th on (empty before)."""
    runs = train_rollouts(trajs)
    wins = [float(t.success) for t in runs]
    out, total = [], sum(wins[:window - 1])
    for i in range(window - 1, len(runs)):
        total += wins[i]
        out.append(SuccessPoint(max((s.policy_version for s in runs[i].steps), default=-1), total / window))
        total -= wins[i - window + 1]
    return out


def first_collapse(curve: Sequence[SuccessPoint], tail: SuccessPoint | None = None) -> Collapse | None:
    """The first window at or below (1 - FALL) of the best before it; else the `tail` point
    (`tail_success`) if it lies below half of the best window; else None. Either only at
    least MIN_DROP below the best."""
    best: SuccessPoint | None = None
    for p in curve:
        if best is not None and _fell(p.success, best.success, (1 - FALL) * best.success + 1e-12):
            return Collapse(p.version, p.success, best.success, best.version)
        if best is None or p.success > best.success:
            best = p
    if tail is not None and best is not None and _fell(tail.success, best.success, 0.5 * best.success - 1e-12):
        return Collapse(tail.version, tail.success, best.success, best.version, late=True)
    return None


def _fell(success: float, best: float, at_most: float) -> bool:
    """`success` at or below `at_most` and at least MIN_DROP below `best`."""
    return success <= at_most and best - success >= MIN_DROP - 1e-12


def tail_success(trajs: Sequence[TrajectoryTiming], versions: int = TAIL_VERSIONS,
                 min_rollouts: int = TAIL_MIN) -> SuccessPoint | None:
    """The success of the train rollouts whose newest step version is among the last
    `versions` policy versions seen, at the newest one; None below `min_rollouts` of them."""
    runs = [(max((s.policy_version for s in t.steps), default=-1), t.success) for t in train_rollouts(trajs)]
    if not runs:
        return None
    last = max(v for v, _ in runs)
    wins = [ok for v, ok in runs if v > last - versions]
    return SuccessPoint(last, sum(wins) / len(wins)) if len(wins) >= min_rollouts else None


def detect_collapse(trajs: Sequence[TrajectoryTiming]) -> Collapse | None:
    """The module docstring's rule over a run's rollouts (ingest order)."""
    return first_collapse(success_curve(trajs), tail_success(trajs))


def lowest_after(curve: Sequence[SuccessPoint], level: float) -> float | None:
    """The lowest success from the first point at or above `level` on (None: never reached)."""
    first = next((i for i, p in enumerate(curve) if p.success >= level), None)
    return None if first is None else min(p.success for p in curve[first:])
