"""Each curation rule with exact expected outcomes."""

import dataclasses

import pytest

from dart_jax.data import curation
from dart_jax.data.config import CurationConfig
from dart_jax.data.curation import TrajRecord

CFG = CurationConfig()


def rec(i: int, success: bool, task: str = "t0", version: int = 5, steps: int = 4) -> TrajRecord:
    return TrajRecord(traj_id=f"{task}-{i}", task_id=task, seq=i, success=success,
                      num_steps=steps, min_version=version, max_version=version)


def ids(recs) -> list[str]:
    return [r.traj_id for r in recs]


# ---- dynamic rollout count -----------------------------------------------------------

@pytest.mark.parametrize("s, n", [
    (0.0, 8), (0.3, 8), (0.59, 8), (0.6, 8), (0.65, 6), (0.7, 5), (0.75, 5), (0.8, 4),
    (0.85, 3), (0.9, 3), (0.95, 2), (1.0, 2)])
def test_rollout_count_table(s, n):
    assert curation.rollout_count(s, CFG) == n


def test_rollout_count_thresholds_are_configurable():
    cfg = dataclasses.replace(CFG, low_success=0.5, numerator=6.0, offset=4.0, min_rollouts=2, max_rollouts=6)
    # s < 0.5 -> 6; else clamp(floor(6/s - 4), 2, 6)
    assert [curation.rollout_count(s, cfg) for s in (0.4, 0.5, 0.6, 0.75, 1.0)] == [6, 6, 6, 4, 2]


def test_success_rate():
    assert curation.success_rate([]) == 0.0
    assert curation.success_rate([True, False, True, True]) == 0.75


# ---- dynamic trajectory length ---------------------------------------------------------

@pytest.mark.parametrize("lengths, expected", [
    ([], 30),                          # default cap before any success
    ([5], 7),                          # 5 + margin 2
    (list(range(1, 11)), 11),          # p90 nearest rank of 1..10 is 9; + 2
    ([1], 3),                          # 1 + 2 = 3 = min_steps
    ([29, 30], 30),                    # 30 + 2 clamped to max_steps
    ([12, 3, 7, 7, 20], 22),           # p90 rank ceil(4.5) = 5 -> 20; + 2
])
def test_max_steps(lengths, expected):
    assert curation.max_steps(lengths, CFG) == expected


def test_max_steps_percentile_margin_and_bounds_are_configurable():
    cfg = dataclasses.replace(CFG, length_percentile=50.0, length_margin=0, min_steps=5,
                              max_steps=10, default_max_steps=8)
    assert curation.max_steps([], cfg) == 8
    assert curation.max_steps([4, 8, 6, 2], cfg) == 5     # median rank 2 -> 4, raised to 5
    assert curation.max_steps([7, 9, 6, 8], cfg) == 7     # sorted 6,7,8,9 rank 2 -> 7
    assert curation.max_steps([40, 50], cfg) == 10


# ---- staleness ---------------------------------------------------------------------------

def test_staleness_bound_counts_from_the_oldest_step():
    mixed = TrajRecord("a", "t0", 0, True, 3, min_version=3, max_version=5)
    assert curation.is_fresh(rec(0, True, version=5), 5, 1)
    assert curation.is_fresh(rec(0, True, version=4), 5, 1)
    assert not curation.is_fresh(rec(0, True, version=3), 5, 1)
    assert not curation.is_fresh(mixed, 5, 1)
    assert not curation.is_fresh(rec(0, True, version=4), 5, 0)
    assert curation.is_fresh(mixed, 5, 2)


# ---- trimming ----------------------------------------------------------------------------

def test_trim_keeps_a_late_success():
    members = [rec(i, success=(i == 10)) for i in range(12)]
    assert ids(curation.trim_group(members, 8)) == ids(members[:7]) + ["t0-10"]


def test_trim_keeps_a_late_failure():
    members = [rec(i, success=(i != 11)) for i in range(12)]
    assert ids(curation.trim_group(members, 8)) == ids(members[:7]) + ["t0-11"]


def test_trim_keeps_order_and_takes_oldest_when_both_present():
    members = [rec(i, success=(i % 3 == 0)) for i in range(10)]
    assert ids(curation.trim_group(members, 4)) == ["t0-0", "t0-1", "t0-2", "t0-3"]


def test_trim_leaves_small_groups_alone():
    members = [rec(i, False) for i in range(5)]
    assert curation.trim_group(members, 8) == members


def test_trim_to_two_keeps_one_of_each():
    members = [rec(0, False), rec(1, False), rec(2, False), rec(3, True)]
    assert ids(curation.trim_group(members, 2)) == ["t0-0", "t0-3"]


# ---- groups and pool injection -------------------------------------------------------------

def test_group_without_success_gets_the_newest_pool_success():
    fresh = [rec(i, False) for i in range(10, 18)]
    pool = [rec(5, True), rec(2, True)]  # newest first
    g = curation.form_group("t0", fresh, pool, need=8, cfg=CFG)
    assert g.injected == ("t0-5",)
    assert ids(g.members) == ["t0-5"] + ids(fresh[:7])  # trimmed to 8, injected kept


def test_pool_injection_never_duplicates_a_member():
    fresh = [rec(i, False) for i in range(3)]
    pool = [rec(1, True), rec(0, True), rec(9, True)]  # ids t0-1, t0-0 are already members
    g = curation.form_group("t0", fresh, pool, need=3, cfg=CFG)
    assert g.injected == ("t0-9",)


def test_group_without_success_and_empty_pool_waits():
    fresh = [rec(i, False) for i in range(8)]
    assert curation.form_group("t0", fresh, [], need=8, cfg=CFG) is None


def test_group_waits_for_its_rollout_count():
    fresh = [rec(0, True), rec(1, False)]
    assert curation.form_group("t0", fresh, [], need=8, cfg=CFG) is None
    assert ids(curation.form_group("t0", fresh, [], need=2, cfg=CFG).members) == ["t0-0", "t0-1"]
    many = [rec(i, i == 0) for i in range(12)]
    assert len(curation.form_group("t0", many, [], need=20, cfg=CFG).members) == 8  # need capped at size


def test_all_success_group_waits_unless_configured():
    fresh = [rec(0, True), rec(1, True)]
    assert curation.form_group("t0", fresh, [], need=2, cfg=CFG) is None
    keep = dataclasses.replace(CFG, keep_all_success_groups=True)
    assert ids(curation.form_group("t0", fresh, [], need=2, cfg=keep).members) == ["t0-0", "t0-1"]


def test_select_groups_takes_oldest_ready_tasks_first():
    fresh = {
        "a": [rec(30 + i, i == 0, task="a") for i in range(2)],
        "b": [rec(10 + i, i == 1, task="b") for i in range(2)],
        "c": [rec(20 + i, i == 0, task="c") for i in range(2)],
        "d": [rec(1, False, task="d")],  # needs 8: not ready
    }
    need = {"a": 2, "b": 2, "c": 2, "d": 8}
    groups = curation.select_groups(fresh, {}, need, tasks_needed=2, cfg=CFG)
    assert [g.task_id for g in groups] == ["b", "c"]
    assert curation.select_groups(fresh, {}, need, tasks_needed=4, cfg=CFG) is None
