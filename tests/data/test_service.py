"""The data manager over ZeroMQ: scheduling, ingestion, batches, stats, pool, bad input."""

import pytest

from dart_jax.testing.trajectories import make_trajectory, task_specs
from dart_jax.wire import RemoteError
from dart_jax.wire.messages import (BatchRequest, CuratedBatch, DataStats, ExportTrajectories, Exported,
                                    NoBatch, PoolImport, PoolImported, ScreenshotRequest, StatsRequest,
                                    SubmitTrajectory, TaskAssignment, TaskRequest, TrajectoryAck)


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
    not_png = make_trajectory("p", "t0", steps=2)
    not_png.screenshots[1] = b"GIF89a" + bytes(100)
    with pytest.raises(RemoteError, match="bad_request: trajectory p screenshot 1: not a PNG"):
        submit(manager, not_png)
    assert not submit(manager, make_trajectory("z", "t0")).duplicate


def test_screenshots_are_served_by_hash_in_bounded_replies(serve_manager, tmp_path):
    # 32 KiB messages: replies carry at most 16 KiB of PNG, here two 8 KiB screenshots
    client = serve_manager(tmp_path, wire={"endpoint": f"ipc://{tmp_path}/dm.sock", "max_message_bytes": 32768})
    for i in range(8):
        submit(client, make_trajectory(f"t0-{i}", "t0", success=i == 0, screenshot_bytes=8192))
        submit(client, make_trajectory(f"t1-{i}", "t1", success=i == 0, screenshot_bytes=8192))
    batch = client.request(BatchRequest(trainer_version=0, after_batch_id=0))
    assert all(t.screenshots == [] for t in batch.trajectories)
    refs = [r for screens in batch.screens for r in screens]
    assert len(refs) == 8 * 3 and {(r.height, r.width) for r in refs} == {(1, 1)}
    want = {t.traj_id: make_trajectory(t.traj_id, t.task_id, success=t.traj_id.endswith("-0"),
                                       screenshot_bytes=8192).screenshots for t in batch.trajectories}
    shas = [r.sha256 for r in batch.screens[0]]
    assert client.request(ScreenshotRequest(sha256=shas)).png == want[batch.trajectories[0].traj_id][:2]
    assert client.request(ScreenshotRequest(sha256=shas[2:])).png == want[batch.trajectories[0].traj_id][2:]

    unknown = "0" * 64
    with pytest.raises(RemoteError, match=f"not_found: .*{unknown}"):
        client.request(ScreenshotRequest(sha256=[shas[0], unknown]))
    for bad in ([shas[0].upper()], [shas[0][:63]], [shas[0] + "\n"], [], [shas[0]] * 257):
        with pytest.raises(RemoteError, match=r"bad_request: .*\$\.sha256"):
            client.request(ScreenshotRequest(sha256=bad))
