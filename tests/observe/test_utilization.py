"""Each utilization formula on tiny hand-built records, with the expected value worked out."""

import pytest

from dart_jax.observe.records import RunRecords, WorkerSync
from dart_jax.observe.utilization import (Window, actions_per_minute, coverage, covered, env_utilization, extent, measure,
                                      merge, rollout_utilization, staleness_counts, staleness_mean, subtract,
                                      trained_in, trainer_utilization)
from tests.observe.builders import batch, rnd, traj

W10 = Window(0.0, 10.0)


def test_window_refuses_empty():
    with pytest.raises(ValueError):
        Window(5.0, 5.0)
    assert Window(40.0, 100.0).seconds == 60.0


def test_merge_unions_clips_and_drops_empty_spans():
    spans = [(3, 5), (1, 2), (4, 7), (7, 8), (5, 5), (0, 0)]
    assert merge(spans) == [(1, 2), (3, 8)]  # (7, 8) touches (3, 7): one span
    assert merge(spans, Window(1.5, 6)) == [(1.5, 2), (3, 6)]
    assert covered(spans, Window(1.5, 6)) == pytest.approx(0.5 + 3)


def test_subtract_cuts_holes_out_of_spans():
    spans = [(0, 4), (3, 6), (8, 10), (12, 13)]
    holes = [(1, 2), (5, 9), (9.5, 11), (20, 21)]
    assert subtract(spans, holes) == [(0, 1), (2, 5), (9, 9.5), (12, 13)]
    assert subtract(spans, []) == [(0, 6), (8, 10), (12, 13)]
    assert subtract([(1, 2)], [(0, 3)]) == []


def test_coverage_is_the_share_of_each_bin_inside_the_spans():
    spans = [(1, 2), (2.5, 3.5), (3, 3.2), (9, 12), (-5, -4)]
    # bins [0,2) [2,4) [4,6) [6,8) [8,10): 1 s, 1 s ((2.5,3.5) holds (3,3.2)), 0, 0, 1 s
    assert coverage(spans, W10, 5).tolist() == pytest.approx([0.5, 0.5, 0, 0, 0.5])
    assert coverage(spans, W10, 1).tolist() == pytest.approx([covered(spans, W10) / 10])
    assert coverage([], W10, 3).tolist() == [0, 0, 0]


def test_env_utilization_counts_calls_per_slot_over_all_slots():
    a = traj("e#0", reset=(0, 1), steps=[((1, 2), (2, 3)), ((3, 5), (5, 6))], evaluate=(6, 7))
    # a second episode on e#0 overlapping the first (never in a real run): counted once
    a2 = traj("e#0", reset=(6.5, 7))
    b = traj("e#1", reset=(8, 9), steps=[((9, 9.5), (9.5, 10.5))])
    # e#0: (0,1) + (2,3) + (5,6) + (6,7) = 4 s; e#1: (8,9) + (9.5,10) in W = 1.5 s; 4 slots
    assert env_utilization([a, a2, b], W10, num_slots=4) == pytest.approx((4 + 1.5) / (4 * 10))
    # an episode outside the window does not count
    assert env_utilization([traj("e#2", reset=(20, 30))], W10, num_slots=1) == 0.0


def test_env_utilization_refuses_more_busy_slots_than_the_run_has():
    trajs = [traj(f"e#{i}", reset=(1, 2)) for i in range(3)]
    with pytest.raises(ValueError, match="3 slots"):
        env_utilization(trajs, W10, num_slots=2)


def test_rollout_utilization_is_the_union_of_a_workers_model_calls():
    e1 = traj("e#0", "w0", steps=[((0, 2), (2, 2.1)), ((6, 7), (7, 7.1))])
    e2 = traj("e#1", "w0", steps=[((1, 3), (3, 3.1))])  # concurrent with e1: (0,3) once
    pool = traj("", "w0", steps=[((3, 6), (0, 0))], source="pool")  # not a rollout
    u = rollout_utilization([e1, e2, pool], [], W10, ["w0", "w1"])
    assert u == {"w0": pytest.approx((3 + 1) / 10), "w1": 0.0}


def test_rollout_utilization_leaves_out_weight_load_pauses():
    e1 = traj("e#0", "w0", steps=[((0, 4), (4, 4.1))])
    syncs = [WorkerSync("w0", 1, True, 0.5, 1.0, 1.5),  # paused 0.5 s inside the model call
             WorkerSync("w0", 2, False, 2.0, 2.5, 3.5),  # a failed sync never paused generation
             WorkerSync("w1", 1, True, 2.0, 2.0, 4.0)]  # another worker's pause
    assert rollout_utilization([e1], syncs, W10, ["w0"]) == {"w0": pytest.approx(3.5 / 10)}


def test_trainer_utilization_is_update_and_publish():
    rounds = [rnd(1, 0, 1, 3, 4), rnd(2, 4, 6, 9, 9.5)]
    # (1,4) = 3 s, (6,9.5) ∩ [0,8) = 2 s; waiting (0,1) and (4,6) is idle
    assert trainer_utilization(rounds, Window(0, 8)) == pytest.approx(5 / 8)


def test_actions_per_minute_counts_batches_whose_update_ended_in_the_window():
    rounds = [rnd(1, 0, 1, 3, 4), rnd(2, 4, 50, 70, 71), rnd(1, 80, 81, 82, 83)]  # batch 1 replayed at 82
    batches = [batch(1, 10), batch(2, 7)]
    assert [b.batch_id for b in trained_in(rounds, batches, Window(0, 60))] == [1]
    assert actions_per_minute(trained_in(rounds, batches, Window(0, 60)), Window(0, 60)) == 10.0
    assert actions_per_minute(trained_in(rounds, batches, Window(0, 30)), Window(0, 30)) == 20.0
    # 10 + 7 + 10 steps over 100 s
    assert actions_per_minute(trained_in(rounds, batches, Window(0, 100)), Window(0, 100)) == pytest.approx(27 * 0.6)


def test_trained_in_refuses_a_batch_the_store_lacks():
    with pytest.raises(KeyError, match=r"\[3\]"):
        trained_in([rnd(3, 0, 1, 2, 3)], [batch(1, 5)], W10)


def test_staleness_counts_and_mean():
    counts = staleness_counts([batch(1, 3, [0, 0, 1]), batch(2, 2, [1, 2])])
    assert counts == {0: 2, 1: 2, 2: 1}
    assert staleness_mean(counts) == pytest.approx((0 + 0 + 1 + 1 + 2) / 5)
    assert staleness_mean({}) == 0.0


def test_measure_puts_every_figure_over_one_window():
    records = RunRecords(
        trajectories=(traj("e#0", "w0", reset=(0, 1), steps=[((1, 4), (4, 5))]),),
        batches=(batch(1, 1, [1]),), rounds=(rnd(1, 5, 6, 8, 9),),
        syncs=(WorkerSync("w1", 1, True, 9, 9.2, 9.4),))
    u = measure(records, W10, num_slots=2)
    assert u.env == pytest.approx(2 / 20)
    assert u.per_worker == {"w0": pytest.approx(0.3), "w1": 0.0}  # w1 is known from its sync only
    assert u.rollout == pytest.approx(0.15)
    assert u.trainer == pytest.approx(0.3)
    assert u.actions_per_min == pytest.approx(6.0)
    assert (u.staleness, u.staleness_mean, u.staleness_max) == ({1: 1}, 1.0, 1)
    assert extent(records) == Window(0, 9.4)
    assert extent(RunRecords()) is None
