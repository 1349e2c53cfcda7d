"""Input pipelines: trajectory files through grain (filter, shuffle, buckets, exact resume, host
shards), curated batches from a real data manager (cursor state, replay after restore,
screenshots by reference), packed rows where they pad less, and host-local batches placed on
an 8-device mesh."""

import json
import threading

import jax
import msgspec
import numpy as np
import pytest

from dart_jax.config import from_dict
from dart_jax.data import service
from dart_jax.data.config import DataManagerConfig
from dart_jax.data.tasks import write_task_file
from dart_jax.testing.trajectories import task_specs, text_trajectory, trajectory
from dart_jax.models.sharding import make_mesh
from dart_jax.train.collate import Collator, rl_microbatches
from dart_jax.train.batch import StepRef
from dart_jax.train.packing import microbatch_rows, padded_positions
from dart_jax.train.batch import to_global
from dart_jax.train.sources import DataManagerSource, TrajectoryFileSource, layout_rl_batch
from dart_jax.train.screens import FetchedScreens, InlineScreens, ScreenCache
from dart_jax.train.version import PolicyVersion
from dart_jax.wire import Client
from dart_jax.wire.messages import BatchRequest, SubmitTrajectory
from dart_jax.wire.trajfiles import write_trajectories
from tests.train_batches import assert_trees_equal, collator, layout_inline


def _step_of_row(trajs):
    """input ids -> (traj_id, step index): identifies every row a pipeline yields."""
    return {np.concatenate([s.prompt_ids, s.response_ids]).tobytes(): (t.traj_id, i)
            for t in trajs for i, s in enumerate(t.steps)}


def _cache(rl, col) -> ScreenCache:
    return ScreenCache(rl.screens, col.image_cfg, 2**30)


def _rows(batch, index):
    """(traj_id, step) of each step a batch holds, row by row, slot by slot."""
    out = []
    for k, j in zip(*np.nonzero(batch.step_weight_BxP)):
        ids = batch.inputs.input_ids[k][batch.inputs.attention_mask[k] == j + 1]
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
    screens = InlineScreens(trajs[:3])
    shapes = [small.shape(t, i, screens.refs(k)) for k, t in enumerate(trajs[:3]) for i in range(len(t.steps))]
    too_big = sum(s.num_slots > 768 for s in shapes)
    assert 0 < too_big < len(shapes)
    source = TrajectoryFileSource(files[0], small, seed=0, shard=(0, 1), read_threads=0)
    assert (source.dropped, small.dropped, len(source.refs)) == (too_big, too_big, len(shapes) - too_big)
    batch = next(iter(source))
    assert batch.inputs.pixel_values.shape[1] == 768


def test_file_source_order_follows_content_not_file_names(trajs, tiny_dir, tmp_path):
    """The same demonstrations under other random ids (file names) give the same batches."""
    renamed = [msgspec.structs.replace(t, traj_id=f"{9 - i}-{t.traj_id}") for i, t in enumerate(trajs)]
    write_trajectories(tmp_path / "first", trajs, "traj")
    write_trajectories(tmp_path / "renamed", renamed, "traj")
    a, b = (iter(TrajectoryFileSource(tmp_path / d, collator(tiny_dir, 2), seed=4, shard=(0, 1), read_threads=0))
            for d in ("first", "renamed"))
    for _ in range(4):
        assert_trees_equal(next(a), next(b))


def test_host_shards_split_one_global_batch(files, tiny_dir):
    whole = next(iter(TrajectoryFileSource(files[0], collator(tiny_dir, 4), seed=1, shard=(0, 1), read_threads=0)))
    parts = [next(iter(TrajectoryFileSource(files[0], collator(tiny_dir, 2), seed=1, shard=(h, 2), read_threads=0)))
             for h in range(2)]
    for name in ("targets_BxT", "loss_mask_BxPxT", "rollout_logp_BxPxT", "group_BxP", "traj_BxP", "step_weight_BxP"):
        np.testing.assert_array_equal(np.concatenate([getattr(p, name) for p in parts]), getattr(whole, name))
    for name in ("input_ids", "pixel_values", "image_token_index", "vision_segment_ids"):
        np.testing.assert_array_equal(np.concatenate([getattr(p.inputs, name) for p in parts]),
                                      getattr(whole.inputs, name))
    np.testing.assert_array_equal(np.concatenate([p.inputs.position_ids for p in parts], axis=1),
                                  whole.inputs.position_ids)


def test_to_global_shards_rows_over_the_mesh(files, tiny_dir):
    local = next(iter(TrajectoryFileSource(files[0], collator(tiny_dir, 8), seed=0, num_epochs=1, shard=(0, 1),
                                           read_threads=0)))  # one epoch: a 7-step partial batch
    assert local.step_weight_BxP[:, 0].tolist() == [1] * 7 + [0]
    mesh = make_mesh(data=2, fsdp=4)
    batch = to_global(local, mesh)
    assert batch.targets_BxT.sharding.spec == jax.sharding.PartitionSpec(("data", "fsdp"))
    assert {s.data.shape for s in batch.inputs.pixel_values.addressable_shards} == {(1, 1536, 1176)}
    assert {s.data.shape for s in batch.inputs.position_ids.addressable_shards} == {(3, 1, 1024)}
    assert_trees_equal(jax.device_get(batch), local)


REPLY_BUDGET = 64 * 2**10  # PNG bytes per screenshot reply: half the data manager's message limit


@pytest.fixture
def data_manager(tmp_path):
    write_task_file(tmp_path / "tasks.jsonl", task_specs(n_train=2))
    cfg = from_dict(DataManagerConfig, {
        "wire": {"endpoint": f"ipc://{tmp_path}/dm.sock", "timeout_s": 10, "max_message_bytes": 2 * REPLY_BUDGET},
        "tasks": {"task_file": "tasks.jsonl"},
        "curation": {"tasks_per_batch": 2, "group_size": 4}})
    stop = threading.Event()
    thread = threading.Thread(target=service.serve, args=(cfg, tmp_path, stop))
    thread.start()
    yield cfg
    stop.set()
    thread.join()


def _submit(wire, trajs) -> None:
    with Client(wire) as client:
        for t in trajs:
            assert not client.request(SubmitTrajectory(trajectory=t)).duplicate


def test_data_manager_source_consumes_in_order_and_replays_after_restore(data_manager, builder, tiny_dir):
    trajs = [trajectory(builder, f"{task}-{i}", task, steps=2, reward=float(i == 2), version=2)
             for task in ("t0", "t1") for i in range(8)]
    _submit(data_manager.wire, trajs)
    index = _step_of_row(trajs)
    source = DataManagerSource(data_manager.wire, collator(tiny_dir, 4), shard=(0, 1), max_wait_s=0.5,
                               version=PolicyVersion(2))
    first = next(source)
    assert (first.batch_id, len(first.trajectories), len(first), first.dropped) == (1, 8, 4, 0)
    assert source.get_state() == {"after_batch_id": 1}
    tasks = list(dict.fromkeys(t.task_id for t in first.trajectories))
    rows = []
    for m, micro in enumerate(rl_microbatches(first, source.collator, _cache(first, source.collator))):
        assert micro.step_weight_BxP.tolist() == [[1], [1], [1], [1]]
        assert first.slot_steps(m).tolist() == list(range(4 * m, 4 * m + 4))  # plan order
        np.testing.assert_array_equal(micro.reward_BxP[:, 0], first.reward_N[4 * m:4 * m + 4])
        np.testing.assert_array_equal(micro.group_BxP[:, 0], first.group_N[4 * m:4 * m + 4])
        np.testing.assert_array_equal(micro.traj_BxP[:, 0], first.traj_N[4 * m:4 * m + 4])
        for k, (tid, i) in enumerate(_rows(micro, index)):
            assert micro.group_BxP[k, 0] == tasks.index(tid.split("-")[0])
            assert micro.reward_BxP[k, 0] == float(tid.endswith("-2"))
            rows.append((tid, i))
    assert sorted(rows) == sorted((t.traj_id, i) for t in first.trajectories for i in range(2))
    assert sorted(zip(first.group_N.tolist(), first.reward_N.tolist())) == sorted(
        (tasks.index(t.task_id), t.reward) for t in first.trajectories for _ in t.steps)

    state = source.get_state()
    source.version.value = 3
    second = next(source)
    assert second.batch_id == 2 and len(second.injected) == 2
    with pytest.raises(TimeoutError, match="no batch after 2"):
        next(source)
    source.close()

    resumed = DataManagerSource(data_manager.wire, collator(tiny_dir, 4), shard=(0, 1), version=PolicyVersion(3))
    resumed.set_state(state)
    replay = next(resumed)
    assert (replay.batch_id, replay.injected) == (2, second.injected)
    assert [t.traj_id for t in replay.trajectories] == [t.traj_id for t in second.trajectories]
    for a, b in zip(rl_microbatches(second, source.collator, _cache(second, source.collator)),
                    rl_microbatches(replay, resumed.collator, _cache(replay, resumed.collator)), strict=True):
        assert_trees_equal(a, b)
    resumed.close()


def _shown(rl, rows) -> list[str]:
    """The sha256 of every screenshot the steps of `rows` show (with repeats)."""
    return [sha for row in rows for r in row
            for sha in Collator.screenshots(rl.trajectories[r.traj], [r.step], rl.screens.refs(r.traj))]


def test_rows_from_screenshot_references_equal_rows_from_bytes(data_manager, builder, tiny_dir):
    trajs = [trajectory(builder, f"{task}-{i}", task, steps=3, reward=float(i == 1), version=2)
             for task in ("t0", "t1") for i in range(4)]
    _submit(data_manager.wire, trajs)
    col = collator(tiny_dir, 2)
    source = DataManagerSource(data_manager.wire, col, shard=(0, 1), max_wait_s=0.5, version=PolicyVersion(2))
    asked, fetch = [], source.fetch_screenshots
    source.fetch_screenshots = lambda shas: asked.append(list(shas)) or fetch(shas)
    rl = next(source)
    assert asked == []  # planned from the screenshots' sizes alone
    cache = _cache(rl, col)
    by_ref = list(rl_microbatches(rl, col, cache))

    full = {t.traj_id: t for t in trajs}
    inline = layout_inline([full[t.traj_id] for t in rl.trajectories], col)
    assert inline.layout == rl.layout
    for a, b in zip(by_ref, rl_microbatches(inline, col, _cache(inline, col)), strict=True):
        assert_trees_equal(a, b)
    # prompts keep two screenshots, so steps share them, across microbatches too: each was
    # fetched once and decoded once, in more than one bounded reply
    shown = _shown(rl, [row for rows in rl.layout for row in rows])
    assert len(shown) > len(set(shown)) and cache.decodes == len(set(shown))
    assert sorted(sha for a in asked for sha in a) == sorted(set(shown))
    assert cache.fetched_bytes > REPLY_BUDGET
    source.close()

    # two hosts: the same plan on each, and each fetches the screenshots of its own rows only
    with Client(data_manager.wire) as client:
        batch = client.request(BatchRequest(trainer_version=2, after_batch_id=0))
    for host in range(2):
        pod = DataManagerSource(data_manager.wire, collator(tiny_dir, 1), shard=(host, 2))
        asked = []
        screens = FetchedScreens(batch.screens, lambda shas: asked.append(list(shas)) or pod.fetch_screenshots(shas))
        rl = layout_rl_batch(batch, pod.collator, screens, shard=(host, 2))
        list(rl_microbatches(rl, pod.collator, _cache(rl, pod.collator)))
        assert sorted(sha for a in asked for sha in a) == sorted(set(_shown(rl, [rows[host] for rows in rl.layout])))
        pod.close()


def _plan(tiny_dir, lengths: list[int]) -> list[list[list[int]]]:
    """microbatch_rows over text steps of these lengths (1024 / 128 token buckets, 2 rows, 4 steps a
    row): each microbatch's rows as lists of step lengths."""
    col = collator(tiny_dir, 2, seq_lens=(128, 1024), num_slots=(768,), pack=4)
    refs = [StepRef(traj=k, step=0, seq_len=n, num_slots=0) for k, n in enumerate(lengths)]
    plan = microbatch_rows(refs, col, hosts=1)
    single = microbatch_rows(refs, collator(tiny_dir, 2, seq_lens=(128, 1024), num_slots=(768,)), hosts=1)
    assert padded_positions(plan, col, 2) <= padded_positions(single, col, 2)
    return [[[r.seq_len for r in row] for row in rows] for rows in plan]


def test_short_steps_share_a_row_where_that_pads_less_than_a_row_each(tiny_dir):
    # one step a row: microbatches [40, 50] (128 tokens) and [60, 900] (1024); packed, 60 and 50
    # fill the 900-step's padding and one 1024-token microbatch holds all four
    assert _plan(tiny_dir, [900, 40, 50, 60]) == [[[40], [900, 60, 50]]]
    # steps share a row only within its own bucket: 60 + 50 fill a 128-token row, 40 opens one
    assert _plan(tiny_dir, [60, 50, 40, 30]) == [[[40, 30], [60, 50]]]
    # packing 20 into a 1000-step's row would leave 1000 beside 100 in a 1024-token microbatch,
    # where one step a row puts 20 and 100 in a 128-token one: it pads more, so no packing
    assert _plan(tiny_dir, [1000, 1000, 100, 20]) == [[[20], [100]], [[1000], [1000]]]
    # ... unless every short step finds room: then the 128-token microbatch disappears
    assert _plan(tiny_dir, [1000, 1000, 20, 20]) == [[[1000, 20], [1000, 20]]]


def test_a_broadcast_batch_travels_in_power_of_two_sizes(monkeypatch):
    """Process 0 broadcasts its batch's bytes; another process, passing None, gets the same batch.
    The bytes travel padded to powers of two: batches of many lengths compile a few broadcasts."""
    from dart_jax.train import sources
    from dart_jax.wire.messages import CuratedBatch

    sent: list[np.ndarray] = []
    monkeypatch.setattr(sources.multihost_utils, "broadcast_one_to_all", lambda x: sent.append(np.asarray(x)) or x)
    rng = np.random.default_rng(0)
    batches = [CuratedBatch(batch_id=b, trainer_version=0, screens=[[] for _ in range(n)],
                            trajectories=[text_trajectory(rng, f"{b}-{i}", "t", 1.0) for i in range(n)])
               for b, n in enumerate((3, 4, 5, 6, 7, 8, 9, 10))]
    for batch in batches:
        assert sources.to_bytes(sources.broadcast_batch(batch)) == sources.to_bytes(batch)
    sizes = [x.shape for x in sent if x.ndim == 1]
    assert len(set(sizes)) < len(batches) // 2 and all(n & (n - 1) == 0 for (n,) in sizes), sizes
    received = iter(sent)  # another process: what process 0 sent arrives
    monkeypatch.setattr(sources.multihost_utils, "broadcast_one_to_all", lambda x: next(received))
    assert [sources.to_bytes(sources.broadcast_batch(None)) for _ in batches] == list(map(sources.to_bytes, batches))
