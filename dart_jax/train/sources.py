"""Where the trainer's batches come from: trajectory files (offline, SFT) and the data manager (RL).

Every host runs the same source: the global batch (rows x hosts) and its bucket are decided
identically everywhere from step shapes (screenshot sizes only: no pixels), and each host
fetches, decodes and preprocesses only its own rows' screenshots (train/screens.py: once per
batch each), so `jax.make_array_from_process_local_data` sees the same shapes on every host.

Offline / SFT, a grain pipeline of host-local TrainBatches with a checkpointable iterator:

    source = TrajectoryFileSource("pool/demos.jsonl", collator, keep=successful_steps, seed=0)
    it = iter(source)                      # grain DatasetIterator of TrainBatch
    batch = to_global(next(it), mesh)      # batch.py: rows sharded over ("data", "fsdp")
    state = it.get_state()                 # JSON-able; it.set_state(state) resumes exactly

RL, one curated GRPO batch per round, laid out in microbatches (built later, by the trainer's
RL preparation: train/prepare.py):

    source = DataManagerSource(wire_cfg, collator, version=trainer.version)  # state: the last batch_id
    batch = next(source)              # RLBatch curated for the current policy version (blocks until ready)
    checkpoint meta: source.get_state(); after a restore, source.set_state(meta) and the data
    manager replays the same batches (it records every batch it hands out).

RL rows may hold several short steps (`BucketSpec.pack` > 1) where that pads less than a row
each: train/packing.py lays them out.
"""

from __future__ import annotations

import hashlib
import logging
import time
from pathlib import Path
from typing import Sequence

import grain
import numpy as np
from jax.experimental import multihost_utils

from dart_jax.train.batch import RLBatch, StepRef, TrainBatch, host_shard, local_rows
from dart_jax.train.collate import Collator, StepFilter, build_batch, dense_ids, step_refs
from dart_jax.train.config import SCREEN_CACHE_BYTES
from dart_jax.train.packing import global_bucket, microbatch_rows
from dart_jax.train.screens import FetchedScreens, InlineScreens, ScreenCache, ScreenSource
from dart_jax.train.version import PolicyVersion
from dart_jax.wire import Client, Message, WireConfig, WireTimeout, from_bytes, to_bytes
from dart_jax.wire.messages import (MAX_SCREENSHOTS_PER_REQUEST, BatchRequest, CuratedBatch, NoBatch,
                                    ScreenshotRequest, Screenshots, Step, Trajectory)
from dart_jax.wire.trajfiles import read_trajectories

log = logging.getLogger(__name__)

def successful_steps(traj: Trajectory, step: Step) -> bool:
    """SFT's default: valid steps of successful trajectories (demonstrations and rollouts)."""
    return traj.status == "success" and step.valid


def every_step(traj: Trajectory, step: Step) -> bool:
    return True


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
        local = local_rows(rows, bucket.rows, self.shard)
        cache = ScreenCache(self.screens, self.collator.image_cfg, self.screen_cache_bytes)
        return build_batch(self.collator, self.trajectories, self.screens, cache, local, bucket,
                           groups=groups, trajs=trajs)


def layout_rl_batch(batch: CuratedBatch, collator: Collator, screens: ScreenSource, *,
                    keep: StepFilter = every_step, shard: tuple[int, int] | None = None) -> RLBatch:
    """Kept steps in global microbatches of rows sorted by shape (`microbatch_rows`: packed
    where that pads less); `screens` names the trajectories' screenshots (FetchedScreens for a data
    manager's batch)."""
    shard = shard or host_shard()
    trajs = tuple(batch.trajectories)
    refs = step_refs(trajs, screens, collator, keep)
    before = collator.dropped
    refs = collator.fit(refs)
    dropped = collator.dropped - before
    layout = tuple(microbatch_rows(refs, collator, shard[1]))
    refs = [r for rows in layout for row in rows for r in row]  # layout order
    groups = dense_ids(t.task_id for t in trajs)
    return RLBatch(
        batch_id=batch.batch_id, trainer_version=batch.trainer_version, trajectories=trajs, screens=screens,
        injected=tuple(batch.injected), layout=layout, buckets=tuple(global_bucket(collator, m) for m in layout),
        reward_N=np.asarray([trajs[r.traj].reward for r in refs], np.float32),
        group_N=np.asarray([groups[trajs[r.traj].task_id] for r in refs], np.int32),
        traj_N=np.asarray([r.traj for r in refs], np.int32),
        injected_N=np.asarray([trajs[r.traj].traj_id in batch.injected for r in refs], np.bool_),
        dropped=dropped, shard=shard)


class NoBatchWithin(TimeoutError):
    """The data manager answered NoBatch for longer than the trainer waits for one batch."""


class DataManagerSource:
    """Curated batches from the data manager, in batch_id order; the state is the cursor.

    `next()` asks for the batch after the last consumed one with `BatchRequest`, waiting
    `retry_after_s` on each NoBatch (up to `max_wait_s`, then NoBatchWithin on every host;
    None: forever). `until` (a `time.monotonic()` value, or None) ends a batch wait sooner:
    the trainer's budget.
    Each request carries the trainer's policy version (`version`, which the publisher
    advances): the data manager curates for it (staleness).
    On a multi-host trainer only process 0 asks for batches; it broadcasts the batch (its
    msgpack bytes: screenshots travel by reference) to the others, every host plans the same
    microbatches, and each fetches the screenshots of its own rows (`fetch_screenshots`).
    """

    def __init__(self, wire: WireConfig, collator: Collator, *, keep: StepFilter = every_step,
                 shard: tuple[int, int] | None = None, max_wait_s: float | None = None,
                 version: PolicyVersion | None = None):
        self.wire, self.collator, self.keep = wire, collator, keep
        self.shard = shard or host_shard()
        self.max_wait_s = max_wait_s
        self.until: float | None = None
        self.version = PolicyVersion() if version is None else version
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
        return layout_rl_batch(batch, self.collator, screens, keep=self.keep, shard=self.shard)

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
            reply = self._ask(BatchRequest(trainer_version=self.version.value,
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
    none (it waited too long): length 0. The bytes travel padded to the next power of two:
    the broadcast compiles once per shape, so a few sizes, not one for each batch."""
    data = np.frombuffer(to_bytes(batch), np.uint8) if batch is not None else np.zeros(0, np.uint8)
    size = int(multihost_utils.broadcast_one_to_all(np.int64(len(data))))
    if size == 0:
        return None
    padded = np.zeros(1 << (size - 1).bit_length(), np.uint8)
    padded[:len(data)] = data
    return from_bytes(np.asarray(multihost_utils.broadcast_one_to_all(padded))[:size].tobytes(), CuratedBatch)
