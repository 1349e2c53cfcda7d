"""Input pipelines: trajectory files through grain (filter, shuffle, buckets, exact resume, host
shards), curated batches from a real data manager (cursor state, replay after restore), and
host-local batches placed on an 8-device mesh."""

import json
import threading

import jax
import numpy as np
import pytest

from dart_jax.config import from_dict
from dart_jax.data import service
from dart_jax.data.config import DataManagerConfig
from dart_jax.data.tasks import write_task_file
from dart_jax.data.testing import task_specs
from dart_jax.models.sharding import make_mesh
from dart_jax.train.pipeline import DataManagerSource, TrajectoryFileSource, to_global
from dart_jax.wire import Client
from dart_jax.wire.messages import SubmitTrajectory
from tests.train.trajectories import assert_trees_equal, collator, trajectory

def _step_of_row(trajs):
    """input ids -> (traj_id, step index): identifies every row a pipeline yields."""
    return {np.concatenate([s.prompt_ids, s.response_ids]).tobytes(): (t.traj_id, i)
            for t in trajs for i, s in enumerate(t.steps)}


def _rows(batch, index):
    out = []
    for k in np.flatnonzero(batch.step_weight_B):
        ids = batch.inputs.input_ids[k][batch.inputs.attention_mask[k] > 0]
        out.append(index[ids.tobytes()])
    return out


def test_file_source_epochs_cover_kept_steps_and_resume_exactly(files, trajs, tiny_dir):
    directory, jsonl = files
    source = TrajectoryFileSource(directory, collator(tiny_dir, 2), seed=3, shard=(0, 1), read_threads=1)
    assert source.dropped == 0 and len(source.refs) == 7  # the failure's steps are filtered out
    index = _step_of_row(trajs)
    it = iter(source)
    stream = [row for _ in range(4) for row in _rows(next(it), index)]  # batches run across epochs
    epoch, second = stream[:7], stream[7:]
    assert sorted(epoch) == [(t, i) for t, n in (("a", 3), ("b", 2), ("c", 2)) for i in range(n)]
    assert epoch != sorted(epoch) and second[0] != epoch[0]  # shuffled, reshuffled each epoch
    state = json.loads(json.dumps(it.get_state()))  # what a checkpoint's JSON metadata holds
    ahead = [next(it) for _ in range(3)]
    assert sorted(second + [r for b in ahead for r in _rows(b, index)][:6]) == sorted(epoch)
    again = iter(TrajectoryFileSource(jsonl, collator(tiny_dir, 2), seed=3, shard=(0, 1), read_threads=1))
    again.set_state(state)
    for a, b in zip(ahead, [next(again) for _ in range(3)]):
        assert_trees_equal(a, b)


def test_file_source_drops_and_counts_steps_no_bucket_holds(files, trajs, tiny_dir):
    small = collator(tiny_dir, 2, num_slots=(768,))
    shapes = [small.shape(t, i) for t in trajs[:3] for i in range(len(t.steps))]
    too_big = sum(s.num_slots > 768 for s in shapes)
    assert 0 < too_big < len(shapes)
    source = TrajectoryFileSource(files[0], small, seed=0, shard=(0, 1), read_threads=0)
    assert (source.dropped, small.dropped, len(source.refs)) == (too_big, too_big, len(shapes) - too_big)
    batch = next(iter(source))
    assert batch.inputs.pixel_values.shape[1] == 768


def test_host_shards_split_one_global_batch(files, tiny_dir):
    whole = next(iter(TrajectoryFileSource(files[0], collator(tiny_dir, 4), seed=1, shard=(0, 1), read_threads=0)))
    parts = [next(iter(TrajectoryFileSource(files[0], collator(tiny_dir, 2), seed=1, shard=(h, 2), read_threads=0)))
             for h in range(2)]
    for name in ("targets_BxT", "loss_mask_BxT", "rollout_logp_BxT", "group_B", "traj_B", "step_weight_B"):
        np.testing.assert_array_equal(np.concatenate([getattr(p, name) for p in parts]), getattr(whole, name))
    for name in ("input_ids", "pixel_values", "image_token_index", "vision_segment_ids"):
        np.testing.assert_array_equal(np.concatenate([getattr(p.inputs, name) for p in parts]),
                                      getattr(whole.inputs, name))
    np.testing.assert_array_equal(np.concatenate([p.inputs.position_ids for p in parts], axis=1),
                                  whole.inputs.position_ids)


def test_to_global_shards_rows_over_the_mesh(files, tiny_dir):
    local = next(iter(TrajectoryFileSource(files[0], collator(tiny_dir, 8), seed=0, num_epochs=1, shard=(0, 1),
                                           read_threads=0)))  # one epoch: a 7-step partial batch
    assert local.step_weight_B.tolist() == [1] * 7 + [0]
    mesh = make_mesh(data=2, fsdp=4)
    batch = to_global(local, mesh)
    assert batch.targets_BxT.sharding.spec == jax.sharding.PartitionSpec(("data", "fsdp"))
    assert {s.data.shape for s in batch.inputs.pixel_values.addressable_shards} == {(1, 1536, 1176)}
    assert {s.data.shape for s in batch.inputs.position_ids.addressable_shards} == {(3, 1, 1024)}
    assert_trees_equal(jax.device_get(batch), local)


@pytest.fixture
def data_manager(tmp_path):
    write_task_file(tmp_path / "tasks.jsonl", task_specs(n_train=2))
    cfg = from_dict(DataManagerConfig, {
        "wire": {"endpoint": f"ipc://{tmp_path}/dm.sock", "timeout_s": 10},
        "tasks": {"task_file": "tasks.jsonl"},
        "curation": {"tasks_per_batch": 2, "group_size": 4}})
    stop = threading.Event()
    thread = threading.Thread(target=service.serve, args=(cfg, tmp_path, stop))
    thread.start()
    yield cfg
    stop.set()
    thread.join()


def test_data_manager_source_consumes_in_order_and_replays_after_restore(data_manager, builder, tiny_dir):
    trajs = [trajectory(builder, f"{task}-{i}", task, steps=2, reward=float(i == 2), version=2)
             for task in ("t0", "t1") for i in range(8)]
    with Client(data_manager.wire) as client:
        for t in trajs:
            assert not client.request(SubmitTrajectory(trajectory=t)).duplicate
    index = _step_of_row(trajs)
    source = DataManagerSource(data_manager.wire, collator(tiny_dir, 4), shard=(0, 1), max_wait_s=0.5,
                               trainer_version=2)
    first = next(source)
    assert (first.batch_id, len(first.trajectories), len(first), first.dropped) == (1, 8, 4, 0)
    assert source.get_state() == {"after_batch_id": 1}
    tasks = list(dict.fromkeys(t.task_id for t in first.trajectories))
    rows = []
    for m, micro in enumerate(first.microbatches(source.collator)):
        assert micro.step_weight_B.tolist() == [1, 1, 1, 1]
        np.testing.assert_array_equal(micro.reward_B, first.reward_N[4 * m:4 * m + 4])  # plan order
        np.testing.assert_array_equal(micro.group_B, first.group_N[4 * m:4 * m + 4])
        np.testing.assert_array_equal(micro.traj_B, first.traj_N[4 * m:4 * m + 4])
        for k, (tid, i) in enumerate(_rows(micro, index)):
            assert micro.group_B[k] == tasks.index(tid.split("-")[0])
            assert micro.reward_B[k] == float(tid.endswith("-2"))
            rows.append((tid, i))
    assert sorted(rows) == sorted((t.traj_id, i) for t in first.trajectories for i in range(2))
    assert sorted(zip(first.group_N.tolist(), first.reward_N.tolist())) == sorted(
        (tasks.index(t.task_id), t.reward) for t in first.trajectories for _ in t.steps)

    state = source.get_state()
    source.trainer_version = 3
    second = next(source)
    assert second.batch_id == 2 and len(second.injected) == 2
    with pytest.raises(TimeoutError, match="no batch after 2"):
        next(source)
    source.close()

    resumed = DataManagerSource(data_manager.wire, collator(tiny_dir, 4), shard=(0, 1), trainer_version=3)
    resumed.set_state(state)
    replay = next(resumed)
    assert (replay.batch_id, replay.injected) == (2, second.injected)
    assert [t.traj_id for t in replay.trajectories] == [t.traj_id for t in second.trajectories]
    for a, b in zip(second.microbatches(source.collator), replay.microbatches(resumed.collator), strict=True):
        assert_trees_equal(a, b)
    resumed.close()
