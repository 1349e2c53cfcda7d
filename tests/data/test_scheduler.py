"""Task scheduling: least-pending training task, its rollout count and step limit."""

import dataclasses

import pytest

from dart_jax.data.config import CurationConfig
from dart_jax.data.scheduler import Scheduler, scheduled_tasks
from dart_jax.data.store import Store
from dart_jax.testing.trajectories import make_trajectory, put
from dart_jax.wire.messages import NoTask, TaskAssignment

CFG = CurationConfig()


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        self.t += 1.0
        return self.t


def test_hands_out_training_tasks_round_robin(store):
    sched = Scheduler(store, CFG, clock=Clock())
    got = [sched.next(latest_version=0) for _ in range(12)]
    assert all(isinstance(a, TaskAssignment) for a in got)
    assert [a.task.task_id for a in got] == [f"t{i}" for i in range(10)] + ["t0", "t1"]
    assert {(a.num_rollouts, a.max_steps) for a in got} == {(8, 30)}  # no history yet


def test_rollout_count_and_step_limit_follow_the_history(store):
    # t3: 9 successes of 10 recent rollouts -> s = 0.9 -> 3 rollouts; success lengths 4..12.
    put(store, *[make_trajectory(f"a{i}", "t3", success=i > 0, steps=3 + i, version=0) for i in range(10)])
    sched = Scheduler(store, dataclasses.replace(CFG, max_staleness=0), clock=Clock())
    assert sched.rollout_budget("t3") == (3, 14)  # p90 of 4..12 (nearest rank 9 of 9) = 12, + 2
    # its 10 stored rollouts are stale at version 1, so it is not starved of new ones
    assert sched.next(latest_version=1).task.task_id == "t0"


def test_pending_rollouts_steer_the_choice_and_arrivals_release_them(store):
    cfg = dataclasses.replace(CFG, max_pending_per_task=8)
    sched = Scheduler(store, cfg, clock=Clock())
    sched.tasks = sched.tasks[:2]  # two tasks: t0, t1
    a, b = sched.next(0), sched.next(0)
    assert (a.task.task_id, b.task.task_id) == ("t0", "t1")
    assert isinstance(sched.next(0), NoTask)  # both have 8 in flight
    for i in range(8):  # t1's rollouts arrive: they are pending (unused) in the store now
        put(store, make_trajectory(f"r{i}", "t1"))
        sched.on_ingested("t1")
    assert isinstance(sched.next(0), NoTask)
    with store.write() as w:  # a batch consumed them
        w.execute("INSERT INTO batches VALUES (1, 0, 0, 1, 8, 0)")
        w.execute("UPDATE trajectories SET used_batch = 1")
    assert sched.next(0).task.task_id == "t1"


def test_the_runs_pending_cap_holds_every_task_back(store):
    cfg = dataclasses.replace(CFG, max_pending_per_task=8, max_pending=12, experience_pool=False)
    sched = Scheduler(store, cfg, clock=Clock())
    sched.tasks = sched.tasks[:3]
    assert sched.next(0).task.task_id == "t0" and sched.next(0).task.task_id == "t1"  # 16 pending
    refused = sched.next(0)
    assert isinstance(refused, NoTask) and "max_pending 12" in refused.reason  # t2 has none, yet waits
    for i in range(8):  # t0's rollouts arrive, all failures: its group waits for a success,
        put(store, make_trajectory(f"r{i}", "t0", success=False))  # so they hold nothing back
        sched.on_ingested("t0")
    assert sched.next(0).task.task_id == "t2"
    put(store, make_trajectory("r8", "t0", success=True))  # t0 can form a group: 9 + 16 in flight
    sched.on_ingested("t0")
    assert isinstance(sched.next(0), NoTask)
    with store.write() as w:  # a batch took t0's rollouts: 16 in flight
        w.execute("INSERT INTO batches VALUES (1, 0, 0, 1, 8, 0)")
        w.execute("UPDATE trajectories SET used_batch = 1")
    assert isinstance(sched.next(0), NoTask)


@pytest.mark.parametrize("keep_all_success", [False, True])
def test_all_success_rollouts_hold_nothing_back_while_their_group_waits_for_a_failure(store, keep_all_success):
    """A good policy leaves tasks whose rollouts all succeeded: their group waits for a
    failure, so counting them against `max_pending` would stall the run (the trainer waiting
    for groups, the workers for the trainer: make run seed 2 at 86% success)."""
    cfg = dataclasses.replace(CFG, max_pending_per_task=8, max_pending=12, experience_pool=False,
                              keep_all_success_groups=keep_all_success)
    sched = Scheduler(store, cfg, clock=Clock())
    sched.tasks = sched.tasks[:3]
    assert sched.next(0).task.task_id == "t0" and sched.next(0).task.task_id == "t1"
    for i in range(8):
        put(store, make_trajectory(f"r{i}", "t0", success=True))
        sched.on_ingested("t0")
    nxt = sched.next(0)
    if keep_all_success:  # the group can go into a batch as it is: 8 + 8 in flight count
        assert isinstance(nxt, NoTask) and "max_pending 12" in nxt.reason
    else:
        assert nxt.task.task_id == "t2"


def test_in_flight_assignments_expire(store):
    clock = Clock()
    sched = Scheduler(store, dataclasses.replace(CFG, max_pending_per_task=8, assignment_timeout_s=5), clock)
    sched.tasks = sched.tasks[:1]
    sched.next(0)
    assert isinstance(sched.next(0), NoTask)
    clock.t += 10
    assert isinstance(sched.next(0), TaskAssignment)


def test_no_training_tasks(tmp_path):
    empty = Store(tmp_path / "s.sqlite", tmp_path / "b")
    assert isinstance(Scheduler(empty, CFG).next(0), NoTask)
    empty.close()


def test_a_restarted_worker_returns_its_assignments_at_once(store):
    sched = Scheduler(store, dataclasses.replace(CFG, max_pending_per_task=8), clock=Clock())
    sched.tasks = sched.tasks[:1]
    first = sched.next(0, "w0", "life-1")
    assert first.num_rollouts == 8 and first.assignment_id
    assert isinstance(sched.next(0, "w0", "life-1"), NoTask)  # 8 in flight
    again = sched.next(0, "w0", "life-2")  # killed and restarted: a new session
    assert isinstance(again, TaskAssignment) and again.assignment_id != first.assignment_id
    assert sched.in_flight() == {"t0": 8}


def test_heartbeats_keep_assignments_and_silence_returns_them(store):
    clock = Clock()
    sched = Scheduler(store, dataclasses.replace(CFG, max_pending_per_task=8, worker_timeout_s=5), clock)
    sched.tasks = sched.tasks[:1]
    sched.next(0, "w0", "s")
    for _ in range(4):  # beats keep it alive well past the timeout
        clock.t += 3
        assert sched.heartbeat("w0", "s")
    assert sched.in_flight() == {"t0": 8}
    clock.t += 10  # silent
    assert sched.in_flight() == {} and not sched.heartbeat("w0", "s")


def test_arrivals_count_against_their_own_assignment(store):
    sched = Scheduler(store, dataclasses.replace(CFG, max_pending_per_task=16), clock=Clock())
    sched.tasks = sched.tasks[:1]
    a, b = sched.next(0, "w0", "s"), sched.next(0, "w1", "s")
    for _ in range(8):
        sched.on_ingested("t0", b.assignment_id)
    assert sched.in_flight() == {"t0": 8}
    assert a.assignment_id != b.assignment_id
    sched.heartbeat("w0", "s2")  # w0 restarts: a's 8 are void; b's were all delivered
    assert sched.in_flight() == {}


def test_a_fixed_task_set_is_visited_again_and_again(store):
    """rl_seeds 3 (the store's t0..t9 have seeds 0..9): only t0, t1, t2 are handed out, each
    again once all three were tried, with rollout counts and step caps from their own history."""
    cfg = dataclasses.replace(CFG, rl_seeds=3, max_pending_per_task=32)
    sched = Scheduler(store, cfg, clock=Clock())
    got = [sched.next(latest_version=0) for _ in range(9)]
    assert [a.task.task_id for a in got] == ["t0", "t1", "t2"] * 3
    put(store, *[make_trajectory(f"a{i}", "t1", success=True, steps=2, version=0) for i in range(16)])
    assert sched.rollout_budget("t1") == (2, 4)  # s = 1 -> 2 rollouts; success lengths 2 + 2
    assert [t.task_id for t in scheduled_tasks(store, cfg)] == ["t0", "t1", "t2"]
    assert len(scheduled_tasks(store, CFG)) == 10  # 0: every train task
