"""The training-success curve, the collapse rule and the low point after a level, on
hand-built rollouts whose windows are counted by hand."""

import dataclasses

import pytest

from dart_jax.observe.learning import Collapse, SuccessPoint, first_collapse, lowest_after, success_curve
from dart_jax.observe.records import StepTiming
from tests.observe.builders import traj


def rollout(success: bool, version: int, **kw):
    t = traj(status="success" if success else "failure", **kw)
    return dataclasses.replace(t, steps=(StepTiming(policy_version=version - 1), StepTiming(policy_version=version)))


def test_the_curve_is_the_rolling_success_of_train_rollouts_with_their_newest_version():
    wins = [1, 0, 0, 1, 1, 1, 0, 1]
    trajs = [rollout(bool(w), version=i) for i, w in enumerate(wins)]
    trajs[2:2] = [traj(status="env_error"), traj(task="e0", split="eval", status="success"),
                  traj(source="pool", status="success")]  # none of them counts
    curve = success_curve(trajs, window=4)
    assert [p.version for p in curve] == [3, 4, 5, 6, 7]
    assert [p.success for p in curve] == [pytest.approx(x) for x in (2 / 4, 2 / 4, 3 / 4, 3 / 4, 3 / 4)]
    assert success_curve(trajs[:3], window=4) == []  # not one full window yet


def test_a_fall_below_half_of_the_best_so_far_is_a_collapse_even_when_it_recovers():
    curve = [SuccessPoint(v, s) for v, s in enumerate([0.4, 0.6, 0.8, 0.5, 0.41, 0.39, 0.9])]
    assert first_collapse(curve) == Collapse(version=5, success=0.39, best=0.8, best_version=2)
    assert first_collapse(curve[:5]) is None  # 0.41 is not below half of 0.8
    assert first_collapse([SuccessPoint(0, 0.0), SuccessPoint(1, 0.0)]) is None  # a best of 0 never halves
    assert first_collapse([]) is None


def test_the_low_point_counts_from_the_first_time_the_level_was_reached():
    curve = [SuccessPoint(v, s) for v, s in enumerate([0.1, 0.3, 0.5, 0.45, 0.7, 0.6])]
    assert lowest_after(curve, 0.5) == 0.45  # the 0.1 and 0.3 before it do not count
    assert lowest_after(curve, 0.05) == 0.1
    assert lowest_after(curve, 0.8) is None  # never reached
