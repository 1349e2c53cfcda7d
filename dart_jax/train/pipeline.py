"""Input pipelines for the trainer: trajectory files (offline, SFT) and the data manager (RL).

Both hand the train step host-local `TrainBatch`es (dart_jax.train.batch) of `buckets.rows`
rows per host; `to_global` turns one into globally sharded jax.Arrays. Every host runs the same
pipeline: the global batch (rows x hosts) and its bucket are decided identically everywhere from
step shapes (cheap, PNG headers only), and each host decodes and preprocesses only its own
rows, so `jax.make_array_from_process_local_data` sees the same shapes on every host.

Offline / SFT, a grain pipeline with a checkpointable iterator:

    source = TrajectoryFileSource("pool/demos.jsonl", collator, keep=successful_steps, seed=0)
    it = iter(source)                      # grain DatasetIterator of TrainBatch
    batch = to_global(next(it), mesh)      # rows sharded over ("data", "fsdp")
    state = it.get_state()                 # JSON-able; it.set_state(state) resumes exactly

RL, one curated GRPO batch per optimizer step, microbatched lazily:

    source = DataManagerSource(wire_cfg, collator)      # state: the last consumed batch_id
    source.trainer_version = policy_version             # the loop sets it before each next()
    rl = next(source)                                   # RLBatch (blocks until one is ready)
    for micro in rl.microbatches(collator):             # TrainBatch each, built on demand
        ...
    checkpoint meta: source.get_state(); after a restore, source.set_state(meta) and the data
    manager replays the same batches (it records every batch it hands out).

An RLBatch's microbatches share task and trajectory ids (`group_B`, `traj_B`), and
`rl.reward_N` / `rl.group_N` list every kept step of the batch, so GRPO's per-group statistics
over the whole curated batch are available before the first microbatch is built.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import grain
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from dart_jax.data.pool import read_trajectories
from dart_jax.train.batch import Bucket, Collator, StepShape, TrainBatch, dense_ids
from dart_jax.wire import Client, WireConfig, WireTimeout, from_bytes, to_bytes
from dart_jax.wire.messages import BatchRequest, CuratedBatch, NoBatch, Step, Trajectory

log = logging.getLogger(__name__)

StepFilter = Callable[[Trajectory, Step], bool]


def successful_steps(traj: Trajectory, step: Step) -> bool:
    """SFT's default: valid steps of successful trajectories (demonstrations and rollouts)."""
    return traj.status == "success" and step.valid


def every_step(traj: Trajectory, step: Step) -> bool:
    return True


@dataclass(frozen=True)
class StepRef:
    """One step of the source's trajectories, with what it needs of a bucket."""
    traj: int
    step: int
    seq_len: int
    num_slots: int


def host_shard() -> tuple[int, int]:
    """(this process's index, process count): which rows of a global batch this host builds."""
    return jax.process_index(), jax.process_count()


def _local_rows(refs: Sequence, rows: int, shard: tuple[int, int]) -> list:
    index, _ = shard
    return list(refs[index * rows:(index + 1) * rows])


def _global_bucket(collator: Collator, refs: Sequence[StepRef]) -> Bucket:
    """The bucket of a global batch (every host picks the same one); rows stay per host."""
    shape = StepShape(max(r.seq_len for r in refs), max(r.num_slots for r in refs))
    return collator.buckets.choose_bucket([shape])


class TrajectoryFileSource:
    """Steps of a *.traj directory or a JSONL file, shuffled by seed, in bucketed batches.

    The steps `keep` accepts are indexed once (too large for every bucket: dropped and counted
    in `dropped`); the order is a grain global shuffle, reshuffled each epoch (`num_epochs`
    None: forever). Iterate for a grain DatasetIterator whose get_state/set_state is the
    exact position. `read_threads` build batches ahead of the train step.
    """

    def __init__(self, path: str | Path, collator: Collator, *, keep: StepFilter = successful_steps,
                 seed: int = 0, num_epochs: int | None = None, shard: tuple[int, int] | None = None,
                 read_threads: int = 2, prefetch: int = 4):
        self.collator = collator
        self.trajectories = list(read_trajectories(Path(path)))
        self.shard = shard or host_shard()
        refs = [StepRef(ti, si, *dataclasses.astuple(collator.shape(t, si)))
                for ti, t in enumerate(self.trajectories) for si, s in enumerate(t.steps)
                if keep(t, s) and collator.trainable(t, si)]
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
        bucket = _global_bucket(self.collator, refs)
        groups = dense_ids(self.trajectories[r.traj].task_id for r in refs)
        trajs = dense_ids(self.trajectories[r.traj].traj_id for r in refs)
        local = _local_rows(refs, bucket.rows, self.shard)
        examples = [ex for r in local for ex in self.collator.examples(self.trajectories[r.traj], [r.step])]
        return self.collator.collate(examples, bucket, groups=groups, trajs=trajs)


@dataclass(frozen=True)
class RLBatch:
    """One curated GRPO batch, planned into microbatches of rows x hosts steps each.

    The *_N arrays list the kept steps in plan order: global row k of microbatch m is entry
    m * rows * hosts + k (this host's rows start at host_index * rows), so per-step values
    computed over the whole batch (advantages.grpo_step_advantages(reward_N, group_N, traj_N,
    ones)) line up with every microbatch's rows."""
    batch_id: int
    trainer_version: int
    trajectories: tuple[Trajectory, ...]
    injected: tuple[str, ...]  # trajectory ids the data manager took from the pool
    plan: tuple[tuple[StepRef, ...], ...]  # global rows of each microbatch
    buckets: tuple[Bucket, ...]  # the bucket of each microbatch
    reward_N: np.ndarray  # float32: every kept step of the batch, in plan order
    group_N: np.ndarray  # int32: its task id within the batch (= group_B's numbering)
    traj_N: np.ndarray  # int32: its trajectory id within the batch (= traj_B's numbering)
    dropped: int  # steps too large for every bucket
    shard: tuple[int, int]

    def __len__(self) -> int:
        return len(self.plan)

    def microbatches(self, collator: Collator) -> Iterator[TrainBatch]:
        """This host's rows of each microbatch, decoded and preprocessed on demand."""
        groups = dense_ids(t.task_id for t in self.trajectories)
        trajs = dense_ids(t.traj_id for t in self.trajectories)
        for refs, bucket in zip(self.plan, self.buckets):
            local = _local_rows(refs, bucket.rows, self.shard)
            examples = [ex for r in local for ex in collator.examples(self.trajectories[r.traj], [r.step])]
            yield collator.collate(examples, bucket, groups=groups, trajs=trajs)


def plan_batch(batch: CuratedBatch, collator: Collator, *, keep: StepFilter = every_step,
               shard: tuple[int, int] | None = None) -> RLBatch:
    """Kept steps sorted by shape (long with long: tight buckets), cut into global microbatches."""
    shard = shard or host_shard()
    trajs = tuple(batch.trajectories)
    refs = [StepRef(ti, si, *dataclasses.astuple(collator.shape(t, si)))
            for ti, t in enumerate(trajs) for si, s in enumerate(t.steps)
            if keep(t, s) and collator.trainable(t, si)]
    before = collator.dropped
    refs = sorted(collator.fit(refs), key=lambda r: (r.seq_len, r.num_slots, r.traj, r.step))
    dropped = collator.dropped - before
    size = collator.buckets.rows * shard[1]
    plan = tuple(tuple(refs[i:i + size]) for i in range(0, len(refs), size))
    groups = dense_ids(t.task_id for t in trajs)
    return RLBatch(
        batch_id=batch.batch_id, trainer_version=batch.trainer_version, trajectories=trajs,
        injected=tuple(batch.injected), plan=plan, buckets=tuple(_global_bucket(collator, p) for p in plan),
        reward_N=np.asarray([trajs[r.traj].reward for r in refs], np.float32),
        group_N=np.asarray([groups[trajs[r.traj].task_id] for r in refs], np.int32),
        traj_N=np.asarray([r.traj for r in refs], np.int32), dropped=dropped, shard=shard)


class DataManagerSource:
    """Curated batches from the data manager, in batch_id order; the state is the cursor.

    `next()` asks for the batch after the last consumed one with `BatchRequest`, waiting
    `retry_after_s` on each NoBatch (up to `max_wait_s`, then TimeoutError; None: forever).
    Set `trainer_version` before each `next()`: the data manager curates for it (staleness).
    On a multi-host trainer only process 0 talks to the data manager; it broadcasts the
    batch (its msgpack bytes) to the others, and every host plans the same microbatches
    and builds its own rows of them.
    """

    def __init__(self, wire: WireConfig, collator: Collator, *, keep: StepFilter = every_step,
                 shard: tuple[int, int] | None = None, max_wait_s: float | None = None,
                 trainer_version: int = 0):
        self.wire, self.collator, self.keep = wire, collator, keep
        self.shard = shard or host_shard()
        self.max_wait_s = max_wait_s
        self.trainer_version = trainer_version
        self.after_batch_id = 0
        self._client: Client | None = None

    def __iter__(self) -> "DataManagerSource":
        return self

    def __next__(self) -> RLBatch:
        index, count = self.shard
        batch = self._fetch() if index == 0 else None
        if count > 1:
            batch = broadcast_batch(batch)
        if batch.batch_id != self.after_batch_id + 1:
            raise RuntimeError(f"asked for the batch after {self.after_batch_id}, got {batch.batch_id}")
        self.after_batch_id = batch.batch_id
        return plan_batch(batch, self.collator, keep=self.keep, shard=self.shard)

    def _fetch(self) -> CuratedBatch:
        deadline = None if self.max_wait_s is None else time.monotonic() + self.max_wait_s
        self._client = self._client or Client(self.wire)
        while True:
            try:
                reply = self._client.request(BatchRequest(trainer_version=self.trainer_version,
                                                          after_batch_id=self.after_batch_id))
            except WireTimeout:  # the data manager is restarting; the request is idempotent
                if deadline is not None and time.monotonic() > deadline:
                    raise
                log.warning("no answer to a batch request; asking again")
                continue
            if isinstance(reply, CuratedBatch):
                return reply
            if not isinstance(reply, NoBatch):
                raise RuntimeError(f"the data manager answered a BatchRequest with {type(reply).__name__}")
            if deadline is not None and time.monotonic() + reply.retry_after_s > deadline:
                raise TimeoutError(f"no batch after {self.after_batch_id} within {self.max_wait_s} s: {reply.reason}")
            log.info("no batch yet (%s); retrying in %.1f s", reply.reason, reply.retry_after_s)
            time.sleep(reply.retry_after_s)

    def get_state(self) -> dict:
        return {"after_batch_id": self.after_batch_id}

    def set_state(self, state: dict) -> None:
        self.after_batch_id = int(state["after_batch_id"])

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def broadcast_batch(batch: CuratedBatch | None) -> CuratedBatch:
    """Process 0's batch on every process (the others pass None): its bytes, their length
    first, through JAX's own cross-process broadcast."""
    from jax.experimental import multihost_utils
    data = np.frombuffer(to_bytes(batch), np.uint8) if batch is not None else np.zeros(0, np.uint8)
    size = int(multihost_utils.broadcast_one_to_all(np.int64(len(data))))
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
