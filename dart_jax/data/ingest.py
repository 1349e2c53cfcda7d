"""Trajectory ingestion: validation, then group commit by one writer thread.

Handler threads validate a trajectory and append its screenshots to the blob packs (before
the commit), then hand it to the writer and wait. The writer takes everything queued
(up to `max_batch`) into one transaction, each trajectory under its own savepoint so one
bad row fails alone, commits, and only then resolves each waiter: an ack always means
committed. Ingestion is idempotent by traj_id (a retry gets `duplicate=True`).
"""

from __future__ import annotations

import logging
import queue
import sqlite3
import threading
from concurrent.futures import Future
from typing import Collection

from dart_jax.data.blobs import BlobRef
from dart_jax.data.store import Store
from dart_jax.wire.messages import Trajectory

log = logging.getLogger(__name__)


def validate(traj: Trajectory, known_tasks: Collection[str]) -> None:
    """Raise ValueError naming the first thing wrong with an incoming trajectory."""
    if not traj.traj_id:
        raise ValueError("traj_id is empty")
    if traj.task_id not in known_tasks:
        raise ValueError(f"trajectory {traj.traj_id}: unknown task {traj.task_id!r}")
    for i, step in enumerate(traj.steps):
        where = f"trajectory {traj.traj_id} step {i}"
        if step.prompt_ids.ndim != 1 or step.response_ids.ndim != 1 or step.logprobs.ndim != 1:
            raise ValueError(f"{where}: prompt_ids, response_ids and logprobs must be 1-D")
        if len(step.logprobs) != len(step.response_ids):
            raise ValueError(f"{where}: {len(step.logprobs)} logprobs for {len(step.response_ids)} tokens")
        bad = [r for r in step.image_refs if not 0 <= r < len(traj.screenshots)]
        if bad:
            raise ValueError(f"{where}: image_refs {bad} outside {len(traj.screenshots)} screenshots")


class IngestWriter:
    """The single writer thread that group-commits trajectories."""

    def __init__(self, store: Store, max_batch: int = 256, on_commit=None):
        self.store, self.max_batch, self.on_commit = store, max_batch, on_commit
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="ingest-writer", daemon=True)
        self._thread.start()

    def submit(self, traj: Trajectory, refs: list[BlobRef]) -> Future:
        """A future resolving to `duplicate` (bool) once the trajectory is committed."""
        fut: Future = Future()
        self._queue.put((traj, refs, fut))
        return fut

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            batch = [item]
            while len(batch) < self.max_batch:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self._queue.put(None)  # finish this batch, then stop
                    break
                batch.append(nxt)
            self._commit(batch)

    def _commit(self, batch: list) -> None:
        results: list = []
        try:
            self.store.blobs.sync()  # no-op unless durability is "power"
            with self.store.write() as w:
                for traj, refs, _ in batch:
                    results.append(self._insert_one(w, traj, refs))
        except Exception as e:  # the commit itself failed: nothing of this batch is stored
            log.exception("ingest: commit of %d trajectories failed", len(batch))
            results = [e] * len(batch)
        for (traj, _, fut), res in zip(batch, results):
            if isinstance(res, Exception):
                fut.set_exception(res)
            else:
                fut.set_result(not res)
                if res and self.on_commit:
                    self.on_commit(traj)

    def _insert_one(self, w: sqlite3.Connection, traj: Trajectory, refs: list[BlobRef]):
        """True if inserted, False if a duplicate, the exception if this row failed."""
        w.execute("SAVEPOINT one")
        try:
            inserted = self.store.insert_trajectory(w, traj, refs)
        except sqlite3.Error as e:
            w.execute("ROLLBACK TO one")
            w.execute("RELEASE one")
            log.warning("ingest: trajectory %s refused: %s", traj.traj_id, e)
            return e
        w.execute("RELEASE one")
        return inserted
