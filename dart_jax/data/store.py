"""The run's store: SQLite in WAL mode plus content-addressed screenshot packs (blobs.py).

One write connection (serialized by a lock) and one read connection per thread; WAL
lets readers proceed while the writer commits. Writes are few, large transactions (the
ingest writer commits many trajectories at once), and every write that others depend
on (a trajectory, a batch's composition) is visible only after its commit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sqlite3
import threading
import time
from pathlib import Path
from typing import Iterator, Sequence

import msgspec

from dart_jax.data import tables
from dart_jax.data.blobs import BlobPacks, BlobRef
from dart_jax.data.config import StoreConfig
from dart_jax.data.curation import Group, TrajRecord
from dart_jax.wire import from_bytes, to_bytes
from dart_jax.wire.messages import ScreenshotRef, Step, TaskSpec, Trajectory
from dart_jax.wire.png import address, png_hw

_REC = "traj_id, task_id, seq, success, num_steps, min_version, max_version"


class ConflictError(RuntimeError):
    """A write that contradicts what the store already holds."""


class NotFoundError(LookupError):
    """A request names something the store does not hold."""


class Store:
    def __init__(self, db_path: Path, blob_dir: Path, durability: str = "process"):
        self.db_path = Path(db_path)
        self.db_path.parent.mkdir(parents=True, exist_ok=True)
        self.sync = "FULL" if durability == "power" else "NORMAL"
        self.blobs = BlobPacks(blob_dir, fsync=durability == "power")
        self._recent: dict[str, BlobRef] = {}  # appended blobs, committed or not (dedup)
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._w = self._connect()
        self._w.execute("PRAGMA journal_mode=WAL")
        tables.migrate(self._w)

    @classmethod
    def open(cls, cfg: StoreConfig, run_dir: Path) -> "Store":
        return cls(cfg.db_file(run_dir), Path(run_dir) / Path(cfg.blob_dir).expanduser(), cfg.durability)

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.db_path, isolation_level=None, check_same_thread=False, timeout=30)
        conn.execute(f"PRAGMA synchronous={self.sync}")
        conn.execute("PRAGMA foreign_keys=ON")
        return conn

    @property
    def _r(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self._connect()
            with self._lock:
                self._readers.append(conn)
        return conn

    @contextlib.contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (BEGIN IMMEDIATE ... COMMIT, rolled back on error)."""
        with self._lock:
            self._w.execute("BEGIN IMMEDIATE")
            try:
                yield self._w
            except BaseException:
                self._w.execute("ROLLBACK")
                raise
            self._w.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            for conn in [*self._readers, self._w]:
                conn.close()
            self._readers.clear()
        self.blobs.close()

    # ---- tasks ---------------------------------------------------------------------

    def upsert_tasks(self, specs: Sequence[TaskSpec]) -> None:
        """Add new tasks; refuse a known task whose split changed (splits stay apart)."""
        known = {t.task_id: t for t in self.tasks()}
        for spec in specs:
            old = known.get(spec.task_id)
            if old is not None and old.split != spec.split:
                raise ConflictError(f"task {spec.task_id!r} is in split {old.split!r} in this "
                                    f"run's store; the task list now says {spec.split!r}")
        with self.write() as w:
            w.executemany(
                "INSERT OR IGNORE INTO tasks VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(s.task_id, s.backend, s.name, s.seed, s.split, s.config, time.time()) for s in specs])

    def tasks(self, split: str | None = None) -> list[TaskSpec]:
        rows = self._r.execute("SELECT task_id, backend, name, seed, split, config FROM tasks "
                               "WHERE ?1 IS NULL OR split = ?1 ORDER BY rowid", (split,))
        return [TaskSpec(task_id=r[0], backend=r[1], name=r[2], seed=r[3], split=r[4], config=r[5])
                for r in rows]

    # ---- trajectories ------------------------------------------------------------------

    def put_screenshots(self, traj: Trajectory) -> list[BlobRef]:
        """Append the trajectory's new screenshots to the packs (before its row commits).
        ValueError, before anything is appended, when one is not a PNG."""
        sizes = []
        for i, png in enumerate(traj.screenshots):
            try:
                sizes.append(png_hw(png))
            except ValueError as e:
                raise ValueError(f"trajectory {traj.traj_id} screenshot {i}: {e}") from None
        return [self._put_blob(png, hw) for png, hw in zip(traj.screenshots, sizes)]

    def _put_blob(self, data: bytes, hw: tuple[int, int]) -> BlobRef:
        digest = address(data)
        ref = self._recent.get(digest)
        if ref is None:
            row = self._r.execute("SELECT pack, offset, size FROM blobs WHERE sha256 = ?", (digest,)).fetchone()
            where = tuple(row) if row else (*self.blobs.append(data), len(data))
            ref = BlobRef(digest, *where, *hw)
            if len(self._recent) >= 100_000:
                self._recent.clear()
            self._recent[digest] = ref
        return ref

    def insert_trajectory(self, w: sqlite3.Connection, traj: Trajectory, refs: Sequence[BlobRef],
                          pool_origin: str | None = None) -> bool:
        """Insert inside the caller's transaction; False when the traj_id is already stored."""
        versions = [s.policy_version for s in traj.steps] or [-1]
        success = traj.status == "success"
        cur = w.execute(
            "INSERT OR IGNORE INTO trajectories (traj_id, task_id, reward, status, success, source,"
            " worker_id, temperature, created_at, ingested_at, num_steps, num_screenshots,"
            " min_version, max_version, head) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (traj.traj_id, traj.task_id, traj.reward, traj.status, success, traj.source,
             traj.worker_id, traj.temperature, traj.created_at, time.time(), len(traj.steps),
             len(refs), min(versions), max(versions),
             to_bytes(msgspec.structs.replace(traj, steps=[], screenshots=[]))))
        if cur.rowcount == 0:
            return False
        w.executemany("INSERT INTO steps VALUES (?, ?, ?, ?, ?, ?, ?, ?)", [
            (traj.traj_id, i, s.policy_version, s.action, s.valid, len(s.prompt_ids),
             len(s.response_ids), to_bytes(s)) for i, s in enumerate(traj.steps)])
        w.executemany("INSERT OR IGNORE INTO blobs VALUES (?, ?, ?, ?, ?, ?)",
                      [(r.sha256, r.pack, r.offset, r.size, r.height, r.width) for r in refs])
        w.executemany("INSERT INTO screenshots VALUES (?, ?, ?)",
                      [(traj.traj_id, i, r.sha256) for i, r in enumerate(refs)])
        w.executemany("INSERT OR IGNORE INTO policy_versions VALUES (?, ?, 'rollout')",
                      [(v, time.time()) for v in sorted(set(versions)) if v >= 0])
        if success:
            origin = pool_origin or ("rollout" if traj.source == "rollout" else "import")
            w.execute("INSERT OR IGNORE INTO pool VALUES (?, ?, ?, ?)",
                      (traj.traj_id, traj.task_id, origin, time.time()))
        return True

    def has_trajectory(self, traj_id: str) -> bool:
        return self._r.execute("SELECT 1 FROM trajectories WHERE traj_id = ?", (traj_id,)).fetchone() is not None

    def load_trajectories(self, traj_ids: Sequence[str], screenshots: bool = True) -> list[Trajectory]:
        """The stored trajectories, in the order asked, with their steps and (unless
        `screenshots` is False: see `screenshot_refs`) their screenshots."""
        if not traj_ids:
            return []
        marks = ",".join("?" * len(traj_ids))
        r = self._r
        steps: dict[str, list[Step]] = {t: [] for t in traj_ids}
        for tid, payload in r.execute(f"SELECT traj_id, payload FROM steps WHERE traj_id IN ({marks}) "
                                      "ORDER BY traj_id, idx", traj_ids):
            steps[tid].append(from_bytes(payload, Step))
        shots: dict[str, list[bytes]] = {t: [] for t in traj_ids}
        for tid, blob in self._screenshot_blobs(traj_ids) if screenshots else ():
            shots[tid].append(self.blobs.read(blob.pack, blob.offset, blob.size))
        rows = {row[0]: row for row in r.execute(
            "SELECT traj_id, task_id, reward, status, worker_id, temperature, created_at, source, head "
            f"FROM trajectories WHERE traj_id IN ({marks})", traj_ids)}
        missing = [t for t in traj_ids if t not in rows]
        if missing:
            raise KeyError(f"trajectories not in the store: {missing[:5]}")
        return [msgspec.structs.replace(_head(rows[t]), steps=steps[t], screenshots=shots[t]) for t in traj_ids]

    def screenshot_refs(self, traj_ids: Sequence[str]) -> list[list[ScreenshotRef]]:
        """Each trajectory's screenshots by content and size, in order (no pixels read, but
        for blobs stored before sizes were recorded: their PNG header is read)."""
        refs: dict[str, list[ScreenshotRef]] = {t: [] for t in traj_ids}
        for tid, blob in self._screenshot_blobs(traj_ids):
            blob = self._sized(blob)
            refs[tid].append(ScreenshotRef(sha256=blob.sha256, height=blob.height, width=blob.width))
        return [refs[t] for t in traj_ids]

    def _screenshot_blobs(self, traj_ids: Sequence[str]) -> Iterator[tuple[str, BlobRef]]:
        marks = ",".join("?" * len(traj_ids))
        for tid, *blob in self._r.execute(
                "SELECT s.traj_id, b.sha256, b.pack, b.offset, b.size, b.height, b.width FROM screenshots s"
                f" JOIN blobs b USING (sha256) WHERE s.traj_id IN ({marks}) ORDER BY s.traj_id, s.idx", traj_ids):
            yield tid, BlobRef(*blob)

    def _sized(self, blob: BlobRef) -> BlobRef:
        """`blob` with its size, read from its PNG header when its row predates migration 3."""
        if blob.height is not None:
            return blob
        hw = png_hw(self.blobs.read(blob.pack, blob.offset, blob.size))
        return dataclasses.replace(blob, height=hw[0], width=hw[1])

    def read_screenshots(self, sha256s: Sequence[str], max_bytes: int) -> list[bytes]:
        """The PNGs of `sha256s` in order, as many as fit `max_bytes` (at least one).
        NotFoundError, before anything is read, when the store lacks one of them."""
        unique = list(dict.fromkeys(sha256s))
        marks = ",".join("?" * len(unique))
        where = {row[0]: row[1:] for row in self._r.execute(
            f"SELECT sha256, pack, offset, size FROM blobs WHERE sha256 IN ({marks})", unique)}
        missing = [s for s in unique if s not in where]
        if missing:
            raise NotFoundError(f"{len(missing)} screenshots are not in the store, e.g. {missing[0]}")
        out, total = [], 0
        for sha in sha256s:
            pack, offset, size = where[sha]
            if out and total + size > max_bytes:
                break
            out.append(self.blobs.read(pack, offset, size))
            total += size
        return out

    def trajectory_ids(self, success_only: bool = False, split: str | None = None,
                            task_ids: Sequence[str] = ()) -> list[str]:
        sql = ("SELECT t.traj_id FROM trajectories t JOIN tasks k USING (task_id) "
               "WHERE (?1 = 0 OR t.success = 1) AND (?2 IS NULL OR k.split = ?2)")
        args: list = [int(success_only), split]
        if task_ids:
            sql += f" AND t.task_id IN ({','.join('?' * len(task_ids))})"
            args += list(task_ids)
        return [r[0] for r in self._r.execute(sql + " ORDER BY t.seq", args)]

    # ---- what curation reads -------------------------------------------------------------

    def fresh_candidates(self, min_version: int) -> dict[str, list[TrajRecord]]:
        """Unused rollouts of training tasks sampled at versions >= min_version, oldest first.
        Environment errors never train (their reward says nothing about the policy)."""
        rows = self._r.execute(
            f"SELECT {_REC} FROM trajectories t WHERE used_batch IS NULL AND source = 'rollout'"
            " AND status != 'env_error' AND min_version >= ?"
            " AND task_id IN (SELECT task_id FROM tasks WHERE split = 'train') ORDER BY seq",
            (min_version,))
        out: dict[str, list[TrajRecord]] = {}
        for row in rows:
            rec = _record(row)
            out.setdefault(rec.task_id, []).append(rec)
        return out

    def pool_successes(self, task_id: str, limit: int = 4) -> list[TrajRecord]:
        """The task's experience pool, newest first."""
        rows = self._r.execute(
            f"SELECT {', '.join('t.' + c.strip() for c in _REC.split(','))} FROM pool p "
            "JOIN trajectories t USING (traj_id) WHERE p.task_id = ? ORDER BY t.seq DESC LIMIT ?",
            (task_id, limit))
        return [_record(r) for r in rows]

    def recent_outcomes(self, task_id: str, window: int) -> list[bool]:
        """Success of the task's last `window` rollouts, newest first (env errors excluded)."""
        rows = self._r.execute(
            "SELECT success FROM trajectories WHERE task_id = ? AND source = 'rollout'"
            " AND status != 'env_error' ORDER BY seq DESC LIMIT ?", (task_id, window))
        return [bool(r[0]) for r in rows]

    def success_lengths(self, task_id: str, window: int) -> list[int]:
        """Step counts of the task's last `window` successes (rollouts and imports alike)."""
        rows = self._r.execute("SELECT num_steps FROM trajectories WHERE task_id = ? AND success = 1"
                               " ORDER BY seq DESC LIMIT ?", (task_id, window))
        return [r[0] for r in rows]

    def unused_counts(self, min_version: int) -> dict[str, int]:
        rows = self._r.execute(
            "SELECT task_id, count(*) FROM trajectories WHERE used_batch IS NULL AND source = 'rollout'"
            " AND status != 'env_error' AND min_version >= ? GROUP BY task_id", (min_version,))
        return dict(rows.fetchall())

    def waiting_tasks(self, min_version: int, pool: bool, all_success_waits: bool = True) -> set[str]:
        """Tasks whose unused fresh rollouts cannot form a group yet: no success among them,
        and none in the task's experience pool to lend (or `pool` off); or, with
        `all_success_waits`, no failure among them (a group without one has no signal)."""
        no_success = "max(success) = 0" + (" AND task_id NOT IN (SELECT task_id FROM pool)" if pool else "")
        rows = self._r.execute(
            "SELECT task_id FROM trajectories WHERE used_batch IS NULL AND source = 'rollout'"
            " AND status != 'env_error' AND min_version >= ? GROUP BY task_id HAVING (" + no_success + ")"
            + (" OR min(success) = 1" if all_success_waits else ""), (min_version,))
        return {r[0] for r in rows}

    # ---- batches and versions ---------------------------------------------------------------

    def last_batch_id(self) -> int:
        return self._r.execute("SELECT coalesce(max(batch_id), 0) FROM batches").fetchone()[0]

    def record_batch(self, batch_id: int, trainer_version: int, groups: Sequence[Group]) -> None:
        """Record the composition and mark its own (non-injected) trajectories used, atomically."""
        items = [(m.traj_id, m.traj_id in g.injected) for g in groups for m in g.members]
        staleness = max((trainer_version - m.min_version for g in groups for m in g.members
                         if m.traj_id not in g.injected), default=0)
        with self.write() as w:
            w.execute("INSERT INTO batches VALUES (?, ?, ?, ?, ?, ?)",
                      (batch_id, trainer_version, time.time(), len(groups), len(items), staleness))
            w.executemany("INSERT INTO batch_items VALUES (?, ?, ?, ?)",
                          [(batch_id, pos, tid, inj) for pos, (tid, inj) in enumerate(items)])
            for tid, injected in items:
                if not injected and w.execute(
                        "UPDATE trajectories SET used_batch = ? WHERE traj_id = ? AND used_batch IS NULL",
                        (batch_id, tid)).rowcount != 1:
                    raise ConflictError(f"trajectory {tid} is already in a batch")

    def batch(self, batch_id: int) -> tuple[int, list[tuple[str, bool]]] | None:
        """(trainer_version, [(traj_id, injected), ...]) of a recorded batch, or None."""
        row = self._r.execute("SELECT trainer_version FROM batches WHERE batch_id = ?", (batch_id,)).fetchone()
        if row is None:
            return None
        items = self._r.execute("SELECT traj_id, injected FROM batch_items WHERE batch_id = ? ORDER BY pos",
                                (batch_id,))
        return row[0], [(t, bool(i)) for t, i in items]

    def note_version(self, version: int, seen_by: str) -> None:
        if self._r.execute("SELECT 1 FROM policy_versions WHERE version = ?", (version,)).fetchone():
            return
        with self.write() as w:
            w.execute("INSERT OR IGNORE INTO policy_versions VALUES (?, ?, ?)", (version, time.time(), seen_by))

    def latest_version(self) -> int:
        return self._r.execute("SELECT coalesce(max(version), 0) FROM policy_versions").fetchone()[0]

    def query(self, sql: str, args: Sequence = ()) -> list[tuple]:
        """A read-only query on this thread's connection (stats, tests, tools)."""
        return self._r.execute(sql, args).fetchall()


def _head(row: tuple) -> Trajectory:
    """The trajectory record of a row: its stored head, or (rows of schema 1) its columns."""
    if row[8] is not None:
        return from_bytes(row[8], Trajectory)
    return Trajectory(traj_id=row[0], task_id=row[1], steps=[], screenshots=[], reward=row[2], status=row[3],
                      worker_id=row[4], temperature=row[5], created_at=row[6], source=row[7])


def _record(row: tuple) -> TrajRecord:
    return TrajRecord(traj_id=row[0], task_id=row[1], seq=row[2], success=bool(row[3]),
                      num_steps=row[4], min_version=row[5], max_version=row[6])
