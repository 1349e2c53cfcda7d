"""Whether RL is learning or collapsing, from the training rollouts a run recorded.

    curve = success_curve(records.trajectories)    # success of the last 256 train rollouts, per rollout
    collapse = first_collapse(curve)               # None, or where it fell below half its best
    low = lowest_after(curve, level=0.436)         # its lowest point once it first reached `level`

The curve runs over train-task rollouts in ingest order, env errors left out, from the
WINDOW-th rollout on. Each point carries the newest policy version among the steps of its
last rollout. The collapse rule (issue 30): success falls below half of the best it reached
before; a run that falls and recovers has still collapsed.

Why 256 rollouts (about three policy versions of `make run`): a task's rollouts arrive
together and share its difficulty (click-test's nearly all fail), so a window holds fewer
independent draws than rollouts. Over one run that held 0.58-0.78 success per five versions
and never fell, windows of 64 rollouts ranged from 0.375 to 0.984 (a false collapse), of 128
from 0.52 to 0.90, of 256 from 0.55 to 0.84.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from dart_jax.observe.records import TrajectoryTiming

WINDOW = 256


@dataclasses.dataclass(frozen=True)
class SuccessPoint:
    version: int  # newest sampling version of the window's last rollout (-1: no steps)
    success: float  # mean success of the window's rollouts


@dataclasses.dataclass(frozen=True)
class Collapse:
    version: int  # where the curve first fell below half of its best so far
    success: float
    best: float
    best_version: int


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


def first_collapse(curve: Sequence[SuccessPoint]) -> Collapse | None:
    """The first point below half of the best before it, or None."""
    best: SuccessPoint | None = None
    for p in curve:
        if best is not None and p.success < 0.5 * best.success:
            return Collapse(p.version, p.success, best.success, best.version)
        if best is None or p.success > best.success:
            best = p
    return None


def lowest_after(curve: Sequence[SuccessPoint], level: float) -> float | None:
    """The lowest success from the first point at or above `level` on (None: never reached)."""
    first = next((i for i, p in enumerate(curve) if p.success >= level), None)
    return None if first is None else min(p.success for p in curve[first:])
