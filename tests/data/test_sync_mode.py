"""The synchronous baseline is a setting of the same data manager: rounds and a barrier."""

import dataclasses

from dart_jax.data.batches import BatchAssembler
from dart_jax.data.config import CurationConfig
from dart_jax.data.scheduler import Scheduler
from dart_jax.testing.trajectories import make_trajectory, put
from dart_jax.wire.messages import BatchRequest, CuratedBatch, NoBatch, NoTask, TaskAssignment

CFG = CurationConfig(tasks_per_batch=2, group_size=8, max_staleness=0, min_rollouts=2, max_rollouts=2)


def test_a_round_is_handed_out_once_per_version_and_only_to_current_workers(store):
    sched = Scheduler(store, CFG, mode="sync")
    first = [sched.next(0, "w0", "s", worker_version=0) for _ in range(3)]
    assert [type(a) for a in first] == [TaskAssignment, TaskAssignment, NoTask]
    assert "handed out" in first[2].reason
    assert sched.round.tasks == [first[0].task.task_id, first[1].task.task_id]
    stale = sched.next(1, "w0", "s", worker_version=0)  # the trainer published version 1
    assert isinstance(stale, NoTask) and "sync to version 1" in stale.reason
    fresh = sched.next(1, "w0", "s", worker_version=1)
    assert isinstance(fresh, TaskAssignment) and sched.round.version == 1 and len(sched.round.tasks) == 1


def test_the_batch_is_exactly_the_round_once_all_of_it_is_in(store):
    sched = Scheduler(store, CFG, mode="sync")
    batches = BatchAssembler(store, CFG, sched)
    a, b = sched.next(0, "w0", "s", 0), sched.next(0, "w0", "s", 0)
    trajs = [make_trajectory(f"{t.task.task_id}-{i}", t.task.task_id, success=False) for t in (a, b) for i in range(2)]
    put(store, *trajs[:3])
    for t in trajs[:3]:
        sched.on_ingested(t.task_id, a.assignment_id if t.task_id == a.task.task_id else b.assignment_id)
    waiting = batches.handle(BatchRequest(trainer_version=0, after_batch_id=0))
    assert isinstance(waiting, NoBatch) and "still rolling out" in waiting.reason
    put(store, trajs[3])
    sched.on_ingested(trajs[3].task_id, b.assignment_id)
    batch = batches.handle(BatchRequest(trainer_version=0, after_batch_id=0))
    # all-failure groups train too (zero advantage): a round never waits for an outcome
    assert isinstance(batch, CuratedBatch) and sorted(t.traj_id for t in batch.trajectories) == sorted(
        t.traj_id for t in trajs)


def test_a_round_without_success_takes_one_from_the_pool(store):
    sched = Scheduler(store, dataclasses.replace(CFG, tasks_per_batch=1), mode="sync")
    put(store, make_trajectory("demo", "t0", success=True, source="pool"))
    batches = BatchAssembler(store, sched.cfg, sched)
    a = sched.next(0, "w0", "s", 0)
    assert a.task.task_id == "t0"
    put(store, *(make_trajectory(f"f{i}", "t0") for i in range(2)))
    for _ in range(2):
        sched.on_ingested("t0", a.assignment_id)
    batch = batches.handle(BatchRequest(trainer_version=0, after_batch_id=0))
    assert batch.injected == ["demo"] and len(batch.trajectories) == 3
