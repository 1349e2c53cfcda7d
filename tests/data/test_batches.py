"""Curated batches through the store: splits, staleness, pool, marks, replay, composition."""

import dataclasses

import pytest

from dart_jax.data.batches import BatchAssembler
from dart_jax.data.config import CurationConfig
from dart_jax.data.store import ConflictError
from dart_jax.testing.trajectories import make_trajectory, put
from dart_jax.wire import to_bytes
from dart_jax.wire.messages import BatchRequest, CuratedBatch, NoBatch

CFG = CurationConfig(tasks_per_batch=2, group_size=4)


def rollouts(task, n, version=5, successes=(0,), start=0):
    return [make_trajectory(f"{task}-v{version}-{start + i}", task, success=(start + i) in successes,
                            version=version) for i in range(n)]


def ask(asm, after=0, version=5):
    return asm.handle(BatchRequest(trainer_version=version, after_batch_id=after))


def group_ids(batch: CuratedBatch) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for t in batch.trajectories:
        out.setdefault(t.task_id, []).append(t.traj_id)
    return out


def test_batch_is_groups_of_ready_tasks_and_marks_them_used(store):
    put(store, *rollouts("t0", 8), *rollouts("t1", 8, successes=(3,)), *rollouts("t2", 3))
    batch = ask(BatchAssembler(store, CFG))
    assert batch.batch_id == 1 and batch.injected == []
    # group_size 4: oldest first, with the first success and failure kept.
    assert group_ids(batch) == {"t0": [f"t0-v5-{i}" for i in range(4)],
                                "t1": ["t1-v5-0", "t1-v5-1", "t1-v5-2", "t1-v5-3"]}
    used = store.query("SELECT traj_id FROM trajectories WHERE used_batch = 1 ORDER BY seq")
    assert [u[0] for u in used] == [t.traj_id for t in batch.trajectories]
    assert store.query("SELECT pos, traj_id, injected FROM batch_items WHERE batch_id = 1 AND pos < 2") == [
        (0, "t0-v5-0", 0), (1, "t0-v5-1", 0)]


def test_evaluation_tasks_never_enter_a_batch(store):
    put(store, *rollouts("e0", 8), *rollouts("e1", 8), *rollouts("t0", 8))
    asm = BatchAssembler(store, CFG)
    assert isinstance(ask(asm), NoBatch)  # only one training task is ready
    put(store, *rollouts("t1", 8))
    assert set(group_ids(ask(asm))) == {"t0", "t1"}


def test_stale_rollouts_are_not_used(store):
    put(store, *rollouts("t0", 8, version=3), *rollouts("t1", 8, version=4), *rollouts("t2", 8, version=5))
    batch = ask(BatchAssembler(store, CFG), version=5)  # max_staleness 1: versions 4 and 5
    assert set(group_ids(batch)) == {"t1", "t2"}
    assert store.query("SELECT max_staleness FROM batches") == [(1,)]  # recorded


def test_staleness_zero_uses_only_the_trainer_version(store):
    put(store, *rollouts("t0", 8, version=4), *rollouts("t1", 4, version=5))
    asm = BatchAssembler(store, dataclasses.replace(CFG, max_staleness=0, tasks_per_batch=1))
    assert set(group_ids(ask(asm, version=5))) == {"t1"}
    assert isinstance(ask(asm, after=1, version=5), NoBatch)


def test_group_without_success_gets_the_newest_pool_success(store):
    demo = make_trajectory("demo-t0", "t0", success=True, source="demo")
    old = make_trajectory("old-t0", "t0", success=True, version=1)  # newer than the demo
    put(store, demo, old, *rollouts("t0", 6, successes=()), *rollouts("t1", 4))
    batch = ask(BatchAssembler(store, CFG))
    assert batch.injected == ["old-t0"]
    assert group_ids(batch)["t0"] == ["old-t0", "t0-v5-0", "t0-v5-1", "t0-v5-2"]
    # injected trajectories stay available for later groups; own ones are used.
    assert store.query("SELECT used_batch FROM trajectories WHERE traj_id = 'old-t0'") == [(None,)]
    assert store.query("SELECT injected FROM batch_items WHERE traj_id = 'old-t0'") == [(1,)]


def test_trimmed_leftovers_form_a_later_group_with_an_injected_success(store):
    put(store, *rollouts("t0", 8), *rollouts("t1", 4))
    asm = BatchAssembler(store, dataclasses.replace(CFG, tasks_per_batch=1))
    assert group_ids(ask(asm)) == {"t0": ["t0-v5-0", "t0-v5-1", "t0-v5-2", "t0-v5-3"]}
    second = ask(asm, after=1)  # t0's four leftover failures are older than t1's rollouts
    assert second.injected == ["t0-v5-0"]  # the newest success, though batch 1 used it
    assert group_ids(second) == {"t0": ["t0-v5-0", "t0-v5-4", "t0-v5-5", "t0-v5-6"]}


def test_group_without_success_and_without_pool_waits(store):
    put(store, *rollouts("t0", 8, successes=()), *rollouts("t1", 8))
    asm = BatchAssembler(store, CFG)
    assert isinstance(ask(asm), NoBatch)
    put(store, make_trajectory("demo-t0", "t0", success=True, source="demo"))
    assert isinstance(ask(BatchAssembler(store, dataclasses.replace(CFG, experience_pool=False))), NoBatch)
    assert ask(asm).injected == ["demo-t0"]


def test_replay_is_identical_and_resume_continues(store):
    put(store, *rollouts("t0", 4), *rollouts("t1", 4), *rollouts("t2", 4), *rollouts("t3", 4))
    asm = BatchAssembler(store, CFG)
    first, second = ask(asm, after=0), ask(asm, after=1, version=6)
    assert (first.batch_id, second.batch_id) == (1, 2)
    assert set(group_ids(first)).isdisjoint(group_ids(second))
    # A resumed trainer gets exactly what it got before, byte for byte.
    assert to_bytes(ask(asm, after=0)) == to_bytes(first)
    assert to_bytes(ask(asm, after=1, version=99)) == to_bytes(second)
    with pytest.raises(ConflictError, match="batches 1..2 exist"):
        ask(asm, after=5)


def test_rollout_count_sets_the_group_size_a_task_waits_for(store):
    # t0 succeeded 10 of its last 10: n(1.0) = 2, so two fresh rollouts make a group.
    put(store, *rollouts("t0", 10, version=0, successes=tuple(range(10))))
    put(store, *rollouts("t0", 2, successes=(100,), start=100), *rollouts("t1", 8))
    batch = ask(BatchAssembler(store, CFG))
    assert group_ids(batch)["t0"] == ["t0-v5-100", "t0-v5-101"]
