"""The training-success curve, the collapse rule and the low point after a level, on
hand-built rollouts whose windows are counted by hand."""

import dataclasses

import pytest

from dart_jax.observe.learning import (Collapse, SuccessPoint, detect_collapse, first_collapse, lowest_after,
                                      success_curve, tail_success)
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


def test_a_fall_of_35_percent_from_the_best_so_far_is_a_collapse_even_when_it_recovers():
    curve = [SuccessPoint(v, s) for v, s in enumerate([0.4, 0.6, 0.8, 0.6, 0.53, 0.52, 0.9])]
    assert first_collapse(curve) == Collapse(version=5, success=0.52, best=0.8, best_version=2)  # 0.52 = 0.65 x 0.8
    assert first_collapse(curve[:5]) is None  # 0.53 is a 34% fall
    assert first_collapse([SuccessPoint(0, 0.0), SuccessPoint(1, 0.0)]) is None  # a best of 0 cannot fall
    assert first_collapse([]) is None


def test_at_low_success_a_fall_needs_a_tenth_of_all_rollouts():
    """A curation probe's noise: its best window 0.160, then 0.102 (a 36% fall, 0.058 of all
    rollouts), then it climbed to 0.23. A fall to 0.06 (0.10 below) is a collapse; so is a
    tail at 0.05, not one at 0.07."""
    probe = [SuccessPoint(v, s) for v, s in enumerate([0.156, 0.160, 0.133, 0.102, 0.164, 0.23])]
    assert first_collapse(probe) is None
    fell = [SuccessPoint(0, 0.16), SuccessPoint(1, 0.06)]
    assert first_collapse(fell) == Collapse(version=1, success=0.06, best=0.16, best_version=0)
    assert first_collapse(probe[:2], SuccessPoint(9, 0.07)) is None  # under half, but 0.09 below
    assert first_collapse(probe[:2], SuccessPoint(9, 0.05)) == Collapse(9, 0.05, 0.16, 1, late=True)


def _rollouts(by_version: dict[int, list[int]]):
    return [rollout(bool(w), version=v) for v, wins in by_version.items() for w in wins]


def test_a_collapse_in_the_last_two_versions_is_caught_by_the_tail():
    """Versions 0-5 succeed 3 in 4, versions 6 and 7 fail all 8. A window of 32 rollouts (all
    of them: 18 wins, 0.5625) shows no fall; the tail (the last two versions' 8 rollouts, at
    0) is under half of it: a late collapse at v7."""
    trajs = _rollouts({v: [1, 1, 1, 0] for v in range(6)} | {6: [0] * 4, 7: [0] * 4})
    curve = success_curve(trajs, window=32)
    assert curve == [SuccessPoint(7, 0.5625)] and first_collapse(curve) is None
    tail = tail_success(trajs, versions=2, min_rollouts=8)
    assert tail == SuccessPoint(7, 0.0)
    assert first_collapse(curve, tail) == Collapse(version=7, success=0.0, best=0.5625, best_version=7, late=True)
    assert tail_success(trajs, versions=2, min_rollouts=9) is None  # too few to judge
    assert detect_collapse(trajs) is None  # the defaults need a 256 window and 64 tail rollouts


def test_a_dip_in_the_tail_that_is_not_a_collapse():
    """The tail at 0.4 against a best window of 0.75 (under 0.65 but over half): no collapse."""
    trajs = _rollouts({v: [1, 1, 1, 0] for v in range(6)} | {6: [1, 0, 0, 0, 1], 7: [1, 0, 0, 1, 0]})
    tail = tail_success(trajs, versions=2, min_rollouts=8)
    assert tail == SuccessPoint(7, 0.4)
    assert first_collapse([SuccessPoint(5, 0.75)], tail) is None
    assert first_collapse([SuccessPoint(5, 0.75)], SuccessPoint(7, 0.37)) == Collapse(7, 0.37, 0.75, 5, late=True)


def test_the_low_point_counts_from_the_first_time_the_level_was_reached():
    curve = [SuccessPoint(v, s) for v, s in enumerate([0.1, 0.3, 0.5, 0.45, 0.7, 0.6])]
    assert lowest_after(curve, 0.5) == 0.45  # the 0.1 and 0.3 before it do not count
    assert lowest_after(curve, 0.05) == 0.1
    assert lowest_after(curve, 0.8) is None  # never reached
