"""Input pipelines for the trainer: trajectory files (offline, SFT) and the data manager (RL).

Both hand the train step host-local `TrainBatch`es (dart_jax.train.batch) of `buckets.rows`
rows per host; `to_global` turns one into globally sharded jax.Arrays. Every host runs the same
pipeline: the global batch (rows x hosts) and its bucket are decided identically everywhere from
step shapes (screenshot sizes only: no pixels), and each host fetches, decodes and preprocesses
only its own rows' screenshots (train/screens.py: once per batch each), so
`jax.make_array_from_process_local_data` sees the same shapes on every host.

Offline / SFT, a grain pipeline with a checkpointable iterator:

    source = TrajectoryFileSource("pool/demos.jsonl", collator, keep=successful_steps, seed=0)
    it = iter(source)                      # grain DatasetIterator of TrainBatch
    batch = to_global(next(it), mesh)      # rows sharded over ("data", "fsdp")
    state = it.get_state()                 # JSON-able; it.set_state(state) resumes exactly

RL, one curated GRPO batch per optimizer step, microbatched lazily:

    source = DataManagerSource(wire_cfg, collator)      # state: the last consumed batch_id
    source.trainer_version = policy_version             # the loop sets it before each next()
    rl = next(source)                                   # RLBatch (blocks until one is ready)
    cache = ScreenCache(rl.screens, collator.image_cfg, max_bytes)   # this batch's pixels
    for micro in rl.microbatches(collator, cache):      # TrainBatch each, built on demand
        ...
    checkpoint meta: source.get_state(); after a restore, source.set_state(meta) and the data
    manager replays the same batches (it records every batch it hands out).

An RLBatch's microbatches share task and trajectory ids (`group_BxP`, `traj_BxP`), and
`rl.reward_N` / `rl.group_N` list every kept step of the batch, so GRPO's per-group statistics
over the whole curated batch are available before the first microbatch is built.

RL rows may hold several short steps (`BucketSpec.pack` > 1) where that pads less than a row
each: train/packing.py plans them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import grain
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from dart_jax.wire.trajfiles import read_trajectories
from dart_jax.train.batch import Bucket, Collator, StepExample, TrainBatch, dense_ids
from dart_jax.train.config import SCREEN_CACHE_BYTES
from dart_jax.train.packing import Row, StepRef, global_bucket, plan_rows
from dart_jax.train.screens import FetchedScreens, InlineScreens, ScreenCache, ScreenSource
from dart_jax.wire import Client, Message, WireConfig, WireTimeout, from_bytes, to_bytes
from dart_jax.wire.messages import (MAX_SCREENSHOTS_PER_REQUEST, BatchRequest, CuratedBatch, NoBatch,
                                    ScreenshotRequest, Screenshots, Step, Trajectory)

log = logging.getLogger(__name__)

StepFilter = Callable[[Trajectory, Step], bool]


def successful_steps(traj: Trajectory, step: Step) -> bool:
    """SFT's default: valid steps of successful trajectories (demonstrations and rollouts)."""
    return traj.status == "success" and step.valid


def every_step(traj: Trajectory, step: Step) -> bool:
    return True


def host_shard() -> tuple[int, int]:
    """(this process's index, process count): which rows of a global batch this host builds."""
    return jax.process_index(), jax.process_count()


def _local_rows(refs: Sequence, rows: int, shard: tuple[int, int]) -> list:
    index, _ = shard
    return list(refs[index * rows:(index + 1) * rows])


def step_refs(trajs: Sequence[Trajectory], screens: ScreenSource, collator: Collator,
              keep: StepFilter) -> list[StepRef]:
    """The steps `keep` accepts and the collator can score, with their shapes (no pixels)."""
    return [StepRef(ti, si, *dataclasses.astuple(collator.shape(t, si, screens.refs(ti))))
            for ti, t in enumerate(trajs) for si, s in enumerate(t.steps)
            if keep(t, s) and collator.trainable(t, si)]


def build_rows(collator: Collator, trajs: Sequence[Trajectory], screens: ScreenSource,
               cache: ScreenCache, refs: Sequence[StepRef]) -> list[StepExample]:
    """The examples of `refs` (a host's steps), their screenshots taken from `cache` at once."""
    shas = [sha for r in refs for sha in collator.screenshots(trajs[r.traj], [r.step], screens.refs(r.traj))]
    pixels = cache.take(shas)
    return [collator.example(trajs[r.traj], r.step, screens.refs(r.traj), pixels) for r in refs]


def build_batch(collator: Collator, trajectories: Sequence[Trajectory], screens: ScreenSource,
                cache: ScreenCache, rows: Sequence[Row], bucket: Bucket, *, groups: dict[str, int],
                trajs: dict[str, int]) -> TrainBatch:
    """A host's `rows` collated into `bucket`; `groups` / `trajs` number tasks / trajectories."""
    examples = iter(build_rows(collator, trajectories, screens, cache, [r for row in rows for r in row]))
    return collator.collate_rows([[next(examples) for _ in row] for row in rows], bucket, groups=groups, trajs=trajs)


def content_key(t: Trajectory) -> tuple[str, bytes]:
    """A trajectory's place in an offline data set: its task, then a digest of what training
    reads from it (token ids and screenshots), never its id, file name or timings."""
    h = hashlib.sha256()
    for part in [x for st in t.steps for x in (st.prompt_ids.tobytes(), st.response_ids.tobytes())] + t.screenshots:
        h.update(len(part).to_bytes(8, "little") + part)
    return t.task_id, h.digest()


class TrajectoryFileSource:
    """Steps of a *.traj directory or a JSONL file, shuffled by seed, in bucketed batches.

    The trajectories are put in content order first (`content_key`), so the data order is a
    function of the data and `seed`, not of file names: a run's demonstrations are files named
    by random trajectory ids. The steps `keep` accepts are indexed once (too large for every
    bucket: dropped and counted in `dropped`); the order is a grain global shuffle, reshuffled
    each epoch (`num_epochs`
    None: forever). Iterate for a grain DatasetIterator whose get_state/set_state is the
    exact position. `read_threads` build batches ahead of the train step.
    """

    def __init__(self, path: str | Path, collator: Collator, *, keep: StepFilter = successful_steps,
                 seed: int = 0, num_epochs: int | None = None, shard: tuple[int, int] | None = None,
                 read_threads: int = 2, prefetch: int = 4, screen_cache_bytes: int = SCREEN_CACHE_BYTES):
        self.collator, self.screen_cache_bytes = collator, screen_cache_bytes
        self.trajectories = sorted(read_trajectories(Path(path)), key=content_key)
        self.screens = InlineScreens(self.trajectories)
        self.shard = shard or host_shard()
        refs = step_refs(self.trajectories, self.screens, collator, keep)
        before = collator.dropped
        self.refs = collator.fit(refs)
        self.dropped = collator.dropped - before
        if not self.refs:
            raise ValueError(f"{path}: no step passes the filter and fits a bucket ({self.dropped} dropped)")
        global_rows = collator.buckets.rows * self.shard[1]
        ds = grain.MapDataset.source(self.refs).shuffle(seed=seed).repeat(num_epochs)
        ds = ds.batch(global_rows, batch_fn=list).map(self._build)
        self.dataset = ds.to_iter_dataset(grain.ReadOptions(num_threads=read_threads,
                                                            prefetch_buffer_size=prefetch))

    def __iter__(self) -> grain.DatasetIterator:
        return iter(self.dataset)

    def _build(self, refs: list[StepRef]) -> TrainBatch:
        rows = [(r,) for r in refs]  # one step a row: an SFT batch is a number of steps
        bucket = global_bucket(self.collator, rows)
        groups = dense_ids(self.trajectories[r.traj].task_id for r in refs)
        trajs = dense_ids(self.trajectories[r.traj].traj_id for r in refs)
        local = _local_rows(rows, bucket.rows, self.shard)
        cache = ScreenCache(self.screens, self.collator.image_cfg, self.screen_cache_bytes)
        return build_batch(self.collator, self.trajectories, self.screens, cache, local, bucket,
                           groups=groups, trajs=trajs)


@dataclass(frozen=True)
class RLBatch:
    """One curated GRPO batch, planned into microbatches of rows x hosts rows each.

    The *_N arrays list the kept steps in plan order (microbatch, global row, place in the row;
    this host's rows start at host_index * rows), and `slot_steps(m)` maps microbatch m's global
    step slots (row g, slot j: g * pack + j) to them, so per-step values computed over the whole
    batch (advantages.grpo_step_advantages(reward_N, group_N, traj_N, ones)) reach every
    microbatch's steps."""
    batch_id: int
    trainer_version: int
    trajectories: tuple[Trajectory, ...]
    screens: ScreenSource  # the trajectories' screenshots
    injected: tuple[str, ...]  # trajectory ids the data manager took from the pool
    plan: tuple[tuple[Row, ...], ...]  # global rows of each microbatch
    buckets: tuple[Bucket, ...]  # the bucket of each microbatch
    reward_N: np.ndarray  # float32: every kept step of the batch, in plan order
    group_N: np.ndarray  # int32: its task id within the batch (= group_BxP's numbering)
    traj_N: np.ndarray  # int32: its trajectory id within the batch (= traj_BxP's numbering)
    dropped: int  # steps too large for every bucket
    shard: tuple[int, int]

    def __len__(self) -> int:
        return len(self.plan)

    def slot_steps(self, m: int) -> np.ndarray:
        """int32 [rows * hosts * pack]: the plan-order step in each global step slot of
        microbatch m, -1 where a slot or row is empty."""
        bucket = self.buckets[m]
        out = np.full(bucket.rows * self.shard[1] * bucket.pack, -1, np.int32)
        first = sum(len(row) for rows in self.plan[:m] for row in rows)
        slots = [g * bucket.pack + j for g, row in enumerate(self.plan[m]) for j in range(len(row))]
        out[slots] = np.arange(first, first + len(slots))
        return out

    def microbatches(self, collator: Collator, cache: ScreenCache) -> Iterator[TrainBatch]:
        """This host's rows of each microbatch, built on demand; their screenshots come from
        `cache` (one per batch: each fetched, decoded and preprocessed once)."""
        groups = dense_ids(t.task_id for t in self.trajectories)
        trajs = dense_ids(t.traj_id for t in self.trajectories)
        for rows, bucket in zip(self.plan, self.buckets):
            local = _local_rows(rows, bucket.rows, self.shard)
            yield build_batch(collator, self.trajectories, self.screens, cache, local, bucket,
                              groups=groups, trajs=trajs)


def plan_batch(batch: CuratedBatch, collator: Collator, screens: ScreenSource, *,
               keep: StepFilter = every_step, shard: tuple[int, int] | None = None) -> RLBatch:
    """Kept steps in global microbatches of rows sorted by shape (`plan_rows`: packed where
    that pads less); `screens` names the trajectories' screenshots (FetchedScreens for a data
    manager's batch)."""
    shard = shard or host_shard()
    trajs = tuple(batch.trajectories)
    refs = step_refs(trajs, screens, collator, keep)
    before = collator.dropped
    refs = collator.fit(refs)
    dropped = collator.dropped - before
    plan = tuple(plan_rows(refs, collator, shard[1]))
    refs = [r for rows in plan for row in rows for r in row]  # plan order
    groups = dense_ids(t.task_id for t in trajs)
    return RLBatch(
        batch_id=batch.batch_id, trainer_version=batch.trainer_version, trajectories=trajs, screens=screens,
        injected=tuple(batch.injected), plan=plan, buckets=tuple(global_bucket(collator, p) for p in plan),
        reward_N=np.asarray([trajs[r.traj].reward for r in refs], np.float32),
        group_N=np.asarray([groups[trajs[r.traj].task_id] for r in refs], np.int32),
        traj_N=np.asarray([r.traj for r in refs], np.int32), dropped=dropped, shard=shard)


class NoBatchWithin(TimeoutError):
    """The data manager answered NoBatch for longer than the trainer waits for one batch."""


class DataManagerSource:
    """Curated batches from the data manager, in batch_id order; the state is the cursor.

    `next()` asks for the batch after the last consumed one with `BatchRequest`, waiting
    `retry_after_s` on each NoBatch (up to `max_wait_s`, then NoBatchWithin on every host;
    None: forever). `until` (a `time.monotonic()` value, or None) ends a batch wait sooner:
    the trainer's budget.
    Set `trainer_version` before each `next()`: the data manager curates for it (staleness).
    On a multi-host trainer only process 0 asks for batches; it broadcasts the batch (its
    msgpack bytes: screenshots travel by reference) to the others, every host plans the same
    microbatches, and each fetches the screenshots of its own rows (`fetch_screenshots`).
    """

    def __init__(self, wire: WireConfig, collator: Collator, *, keep: StepFilter = every_step,
                 shard: tuple[int, int] | None = None, max_wait_s: float | None = None,
                 trainer_version: int = 0):
        self.wire, self.collator, self.keep = wire, collator, keep
        self.shard = shard or host_shard()
        self.max_wait_s = max_wait_s
        self.until: float | None = None
        self.trainer_version = trainer_version
        self.after_batch_id = 0
        self._client: Client | None = None

    def __iter__(self) -> "DataManagerSource":
        return self

    def __next__(self) -> RLBatch:
        index, count = self.shard
        batch, waited = None, None
        if index == 0:
            try:
                batch = self._fetch()
            except NoBatchWithin as e:
                waited = e
        if count > 1:
            batch = broadcast_batch(batch)
        if batch is None:
            raise waited or NoBatchWithin(f"process 0 got no batch after {self.after_batch_id} "
                                          f"within {self.max_wait_s} s")
        if batch.batch_id != self.after_batch_id + 1:
            raise RuntimeError(f"asked for the batch after {self.after_batch_id}, got {batch.batch_id}")
        self.after_batch_id = batch.batch_id
        screens = FetchedScreens(batch.screens, self.fetch_screenshots)
        return plan_batch(batch, self.collator, screens, keep=self.keep, shard=self.shard)

    def fetch_screenshots(self, sha256s: Sequence[str]) -> list[bytes]:
        """PNG bytes by hash, in order, over this host's own link to the data manager: as
        many requests as its bounds (hashes per request, bytes per reply) take."""
        out: list[bytes] = []
        while len(out) < len(sha256s):
            ask = list(sha256s[len(out):len(out) + MAX_SCREENSHOTS_PER_REQUEST])
            reply = self._ask(ScreenshotRequest(sha256=ask), self._deadline())
            if not isinstance(reply, Screenshots) or not 0 < len(reply.png) <= len(ask):
                raise RuntimeError(f"the data manager answered a ScreenshotRequest with {type(reply).__name__}")
            out += reply.png
        return out

    def _deadline(self) -> float | None:
        return None if self.max_wait_s is None else time.monotonic() + self.max_wait_s

    def _ask(self, msg: Message, deadline: float | None) -> Message:
        """The data manager's reply, asked again while it does not answer (it may be
        restarting; every request here is idempotent) until `deadline`."""
        self._client = self._client or Client(self.wire)
        while True:
            try:
                return self._client.request(msg)
            except WireTimeout:
                if deadline is not None and time.monotonic() > deadline:
                    raise
                log.warning("no answer to a %s; asking again", type(msg).__name__)

    def _fetch(self) -> CuratedBatch:
        deadline, reason = self._deadline(), None
        if self.until is not None:
            deadline = self.until if deadline is None else min(deadline, self.until)
        while True:
            reply = self._ask(BatchRequest(trainer_version=self.trainer_version,
                                           after_batch_id=self.after_batch_id), deadline)
            if isinstance(reply, CuratedBatch):
                return reply
            if not isinstance(reply, NoBatch):
                raise RuntimeError(f"the data manager answered a BatchRequest with {type(reply).__name__}")
            if deadline is not None and time.monotonic() >= deadline:
                raise NoBatchWithin(f"no batch after {self.after_batch_id} within the wait: {reply.reason}")
            if reply.reason != reason:  # once per reason: the poll is frequent
                log.info("no batch yet (%s); asking every %.2f s", reply.reason, reply.retry_after_s)
                reason = reply.reason
            time.sleep(reply.retry_after_s if deadline is None else
                       min(reply.retry_after_s, max(0.0, deadline - time.monotonic())))

    def get_state(self) -> dict:
        return {"after_batch_id": self.after_batch_id}

    def set_state(self, state: dict) -> None:
        self.after_batch_id = int(state["after_batch_id"])

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def broadcast_batch(batch: CuratedBatch | None) -> CuratedBatch | None:
    """Process 0's batch on every process (the others pass None): its bytes, their length
    first, through JAX's own cross-process broadcast. None everywhere when process 0 has
    none (it waited too long): length 0."""
    from jax.experimental import multihost_utils
    data = np.frombuffer(to_bytes(batch), np.uint8) if batch is not None else np.zeros(0, np.uint8)
    size = int(multihost_utils.broadcast_one_to_all(np.int64(len(data))))
    if size == 0:
        return None
    data = data if batch is not None else np.zeros(size, np.uint8)
    return from_bytes(np.asarray(multihost_utils.broadcast_one_to_all(data)).tobytes(), CuratedBatch)


def batch_specs(batch: TrainBatch, axes: tuple[str, ...] = ("data", "fsdp")) -> TrainBatch:
    """PartitionSpecs sharding every array's batch dimension over `axes` (position_ids: dim 1)."""
    rows = PartitionSpec(axes)
    inputs = jax.tree.map(lambda _: rows, batch.inputs)
    inputs = dataclasses.replace(inputs, position_ids=PartitionSpec(None, axes))
    return dataclasses.replace(jax.tree.map(lambda _: rows, batch), inputs=inputs)


def to_global(batch: TrainBatch, mesh: Mesh, specs: TrainBatch | None = None) -> TrainBatch:
    """Host-local rows -> global jax.Arrays on `mesh` (each host passes its own rows)."""
    specs = specs if specs is not None else batch_specs(batch)
    shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), specs,
                             is_leaf=lambda x: isinstance(x, PartitionSpec))
    return jax.make_array_from_process_local_data(shardings, batch)
