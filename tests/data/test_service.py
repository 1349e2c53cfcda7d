"""The data manager over ZeroMQ: scheduling, ingestion, batches, stats, pool, bad input."""

import pytest

from dart_jax.data.testing import make_trajectory, task_specs
from dart_jax.wire import RemoteError
from dart_jax.wire.messages import (BatchRequest, CuratedBatch, DataStats, ExportTrajectories, Exported,
                                    NoBatch, PoolImport, PoolImported, StatsRequest, SubmitTrajectory,
                                    TaskAssignment, TaskRequest, TrajectoryAck)


@pytest.fixture
def manager(serve_manager, tmp_path):
    return serve_manager(tmp_path)


def submit(client, traj):
    return client.request(SubmitTrajectory(trajectory=traj))


def test_serves_the_whole_loop(manager, tmp_path):
    a = manager.request(TaskRequest(worker_id="w0", policy_version=2))
    assert isinstance(a, TaskAssignment) and (a.task.task_id, a.num_rollouts, a.max_steps) == ("t0", 8, 30)
    assert manager.request(TaskRequest(worker_id="w0", policy_version=2)).task.task_id == "t1"
    assert manager.request(TaskRequest(worker_id="w0", policy_version=2)).task.task_id == "t9"
    for task in ("t0", "t1"):
        for i in range(8):
            ack = submit(manager, make_trajectory(f"{task}-{i}", task, success=i == 2, version=2))
            assert ack == TrajectoryAck(traj_id=f"{task}-{i}", duplicate=False)
    assert submit(manager, make_trajectory("t0-3", "t0", version=2)).duplicate
    submit(manager, make_trajectory("e-0", "e0", success=True, version=2))
    batch = manager.request(BatchRequest(trainer_version=2, after_batch_id=0))
    assert isinstance(batch, CuratedBatch) and len(batch.trajectories) == 8
    assert {t.task_id for t in batch.trajectories} == {"t0", "t1"}
    # the four trimmed failures of each task wait no longer: the pool gives each a success
    again = manager.request(BatchRequest(trainer_version=3, after_batch_id=1))
    assert (again.batch_id, again.injected) == (2, ["t0-2", "t1-2"])
    assert isinstance(manager.request(BatchRequest(trainer_version=3, after_batch_id=2)), NoBatch)

    stats = manager.request(StatsRequest())
    assert isinstance(stats, DataStats)
    assert (stats.trajectories, stats.steps, stats.batches, stats.latest_version) == (17, 51, 2, 3)
    t0 = stats.tasks[0]
    assert (t0.task_id, t0.attempts, t0.successes, t0.success_rate, t0.unused, t0.pool) == ("t0", 8, 1, 0.125, 1, 1)
    assert (t0.rollouts, t0.max_steps, t0.min_version, t0.max_version) == (8, 5, 2, 2)
    assert [s.split for s in stats.tasks] == ["train", "train", "eval", "train"]

    exported = manager.request(ExportTrajectories(path="export/ok.jsonl", success_only=True))
    assert exported == Exported(path=str(tmp_path / "export/ok.jsonl"), count=3)
    imported = manager.request(PoolImport(path="export/ok.jsonl"))
    assert imported == PoolImported(imported=0, duplicates=3, skipped=0)


def test_bad_input_gets_a_clear_error_and_the_service_keeps_serving(manager):
    with pytest.raises(RemoteError, match="bad_request: .*unknown task 'nope'"):
        submit(manager, make_trajectory("x", "nope"))
    bad = make_trajectory("y", "t0", steps=2)
    bad.steps[0].image_refs.append(9)
    with pytest.raises(RemoteError, match="bad_request: .*image_refs"):
        submit(manager, bad)
    with pytest.raises(RemoteError, match="conflict: after_batch_id 4"):
        manager.request(BatchRequest(trainer_version=0, after_batch_id=4))
    with pytest.raises(RemoteError, match="does not serve TaskAssignment"):
        manager.request(TaskAssignment(task=task_specs(1)[0], num_rollouts=1, max_steps=1))
    with pytest.raises(RemoteError, match="bad_request: .*missing.jsonl: no such file"):
        manager.request(PoolImport(path="missing.jsonl"))
    assert not submit(manager, make_trajectory("z", "t0")).duplicate
