"""A run directory's records as typed values, read incrementally.

    reader = RunReader(Path("runs/local"))
    records = reader.refresh()      # everything so far; later calls read only what is new

Sources: the data manager's store (trajectories with their wall-clock stamps, batches and
the sampling versions of their steps), the trainer's step log (metrics/trainer.jsonl),
each rollout worker's log (metrics/rollout-<worker_id>.jsonl) and the evaluation results
(eval/<label>.json). The store is opened read-only; each refresh reads the rows after the
last trajectory seq and batch id it has seen, and each log from the byte offset where the
previous refresh stopped, so a refresh costs what is new, not the size of the run. Step
payloads are decoded into `StepTiming` alone: msgpack skips the token arrays unbuilt.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from pathlib import Path
from typing import Any

import msgspec

from dart_jax.data import tables
from dart_jax.data.config import StoreConfig
from dart_jax.rundir import RunDir

Interval = tuple[float, float]  # wall-clock (start, end); (0, 0) when it never happened


@dataclasses.dataclass(frozen=True)
class StepTiming:
    """The fields of a stored wire `Step` that measure the system (decoded by name)."""
    gen_s: Interval = (0.0, 0.0)
    env_s: Interval = (0.0, 0.0)
    policy_version: int = -1
    straddles_update: bool = False


@dataclasses.dataclass(frozen=True)
class _Head:
    """The fields of a stored trajectory head (wire `Trajectory` without steps) read here."""
    env_slot: str = ""
    reset_s: Interval = (0.0, 0.0)
    evaluate_s: Interval = (0.0, 0.0)
    weight_loads: tuple[tuple[int, float, float], ...] = ()


@dataclasses.dataclass(frozen=True)
class TrajectoryTiming:
    seq: int  # ingest order
    traj_id: str
    task_id: str
    split: str  # the task's: "train" or "eval"
    status: str
    reward: float
    source: str  # "rollout", "pool" or "demo"
    worker_id: str
    created_at: float  # the episode ended (worker clock)
    ingested_at: float  # committed to the store
    env_slot: str  # "ENDPOINT#SLOT"; "" when not played on an env server
    reset_s: Interval
    evaluate_s: Interval
    weight_loads: tuple[tuple[int, float, float], ...]  # (version, paused, resumed)
    steps: tuple[StepTiming, ...]

    @property
    def success(self) -> bool:
        return self.status == "success"


@dataclasses.dataclass(frozen=True)
class BatchRecord:
    batch_id: int
    trainer_version: int  # the policy version the trainer held when the batch was made
    created_at: float
    trajectories: int  # its own and injected ones
    steps: int  # steps of all its trajectories
    staleness: tuple[int, ...]  # trainer_version - policy_version of each step of its own trajectories


@dataclasses.dataclass(frozen=True)
class TrainerRound:
    """One round of the RL loop (fetch a batch, update on it, publish), from trainer.jsonl."""
    step: int  # optimizer steps done after the round
    policy_version: int  # published at the end of the round
    batch_id: int
    fetch_start: float
    update_start: float
    publish_start: float
    publish_end: float


@dataclasses.dataclass(frozen=True)
class WorkerSync:
    worker_id: str
    version: int
    ok: bool
    started: float  # pull began (generation goes on)
    paused: float  # generation paused for the load
    resumed: float


@dataclasses.dataclass(frozen=True)
class EvalResult:
    """One mode of an eval/<label>.json (`dart-jax eval`): held-out success overall."""
    label: str
    mode: str  # "sampled" (at the rollout temperature) or "greedy"
    time: float
    success: float
    n: int
    ci95: Interval


@dataclasses.dataclass(frozen=True)
class RunRecords:
    trajectories: tuple[TrajectoryTiming, ...] = ()  # in ingest order
    batches: tuple[BatchRecord, ...] = ()  # in batch id order
    rounds: tuple[TrainerRound, ...] = ()
    syncs: tuple[WorkerSync, ...] = ()
    evals: tuple[EvalResult, ...] = ()  # by time

    def workers(self) -> list[str]:
        """Worker ids seen in rollouts or weight syncs, sorted."""
        return sorted({t.worker_id for t in self.trajectories if t.source == "rollout"}
                      | {s.worker_id for s in self.syncs})


HEAD_SCHEMA = 2  # the store migration that added trajectories.head
_STEP = msgspec.msgpack.Decoder(StepTiming)  # other fields of the stored Step are skipped unbuilt
_HEAD = msgspec.msgpack.Decoder(_Head)
_TRAJ_SQL = """
SELECT t.seq, t.traj_id, t.task_id, k.split, t.status, t.reward, t.source, t.worker_id,
       t.created_at, t.ingested_at, t.head
FROM trajectories t JOIN tasks k USING (task_id) WHERE t.seq > ? ORDER BY t.seq
"""
_STEPS_SQL = """
SELECT s.traj_id, s.payload FROM trajectories t JOIN steps s USING (traj_id)
WHERE t.seq > ? AND t.seq <= ? ORDER BY s.traj_id, s.idx
"""
_BATCH_SQL = """
SELECT b.batch_id, b.trainer_version, b.created_at, count(*), sum(t.num_steps)
FROM batches b JOIN batch_items i USING (batch_id) JOIN trajectories t USING (traj_id)
WHERE b.batch_id > ? GROUP BY b.batch_id ORDER BY b.batch_id
"""
_STALENESS_SQL = """
SELECT i.batch_id, b.trainer_version - s.policy_version
FROM batch_items i JOIN batches b USING (batch_id) JOIN steps s ON s.traj_id = i.traj_id
WHERE i.batch_id > ? AND i.injected = 0
"""


class StoreReader:
    """New trajectories and batches from the store, on a read-only connection."""

    def __init__(self, db_path: Path):
        self.db_path = db_path
        self.last_seq = self.last_batch = 0
        self._conn: sqlite3.Connection | None = None

    def read(self) -> tuple[list[TrajectoryTiming], list[BatchRecord]]:
        conn = self._connect()
        if conn is None:
            return [], []
        conn.execute("BEGIN")  # one snapshot: a batch's items are never newer than what was read
        try:
            if tables.version(conn) < HEAD_SCHEMA:  # the data manager is still creating the store
                return [], []
            return self._trajectories(conn), self._batches(conn)
        finally:
            conn.execute("COMMIT")

    def _connect(self) -> sqlite3.Connection | None:
        if self._conn is None and self.db_path.exists():
            self._conn = sqlite3.connect(f"file:{self.db_path}?mode=ro", uri=True, isolation_level=None,
                                         check_same_thread=False)
        return self._conn

    def _trajectories(self, conn: sqlite3.Connection) -> list[TrajectoryTiming]:
        rows = conn.execute(_TRAJ_SQL, (self.last_seq,)).fetchall()
        if not rows:
            return []
        steps: dict[str, list[StepTiming]] = {}
        for traj_id, payload in conn.execute(_STEPS_SQL, (self.last_seq, rows[-1][0])):
            steps.setdefault(traj_id, []).append(_STEP.decode(payload))
        self.last_seq = rows[-1][0]
        return [_trajectory(row, steps.get(row[1], [])) for row in rows]

    def _batches(self, conn: sqlite3.Connection) -> list[BatchRecord]:
        staleness: dict[int, list[int]] = {}
        for batch_id, stale in conn.execute(_STALENESS_SQL, (self.last_batch,)):
            staleness.setdefault(batch_id, []).append(stale)
        batches = [BatchRecord(b, v, t, n, steps, tuple(staleness.get(b, ())))
                   for b, v, t, n, steps in conn.execute(_BATCH_SQL, (self.last_batch,))]
        if batches:
            self.last_batch = batches[-1].batch_id
        return batches

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _trajectory(row: tuple, steps: list[StepTiming]) -> TrajectoryTiming:
    seq, traj_id, task_id, split, status, reward, source, worker_id, created, ingested, head = row
    # stores of schema 1 have no head: such trajectories carry no env timings
    h = _HEAD.decode(head) if head is not None else _Head()
    return TrajectoryTiming(seq, traj_id, task_id, split, status, reward, source, worker_id, created, ingested,
                            h.env_slot, h.reset_s, h.evaluate_s, h.weight_loads, tuple(steps))


class JsonlTail:
    """The complete lines appended to a JSONL file since the last read."""

    def __init__(self, path: Path):
        self.path, self.offset = path, 0

    def read(self) -> list[dict[str, Any]]:
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1  # a line still being written waits for the next read
        self.offset += end
        return [json.loads(line) for line in data[:end].splitlines() if line.strip()]


def trainer_round(line: dict[str, Any]) -> TrainerRound | None:
    """The RL round a trainer.jsonl line records; None for lines without its stamps (SFT)."""
    if "time/update_start" not in line:
        return None
    return TrainerRound(step=line["step"], policy_version=line["policy/version"], batch_id=line["batch/id"],
                        fetch_start=line["time/fetch_start"], update_start=line["time/update_start"],
                        publish_start=line["time/publish_start"], publish_end=line["time/publish_end"])


def worker_sync(worker_id: str, line: dict[str, Any]) -> WorkerSync | None:
    """The weight sync a rollout log line records; None for trajectory lines."""
    if "sync_version" not in line:
        return None
    return WorkerSync(worker_id, line["sync_version"], line["sync_ok"], line["sync_started"],
                      line["sync_paused"], line["sync_resumed"])


EVAL_MODES = ("sampled", "greedy")


def eval_results(path: Path) -> list[EvalResult] | None:
    """The overall result of each mode in an eval/<label>.json; None while the file is not
    yet complete JSON."""
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError:
        return None
    return [EvalResult(doc["label"], mode, doc["time"], doc[mode]["overall"]["success"], doc[mode]["overall"]["n"],
                       tuple(doc[mode]["overall"]["ci95"])) for mode in EVAL_MODES if mode in doc]


class RunReader:
    """Accumulates a run's records; `refresh` reads what was written since the last call."""

    def __init__(self, run_dir: Path, db_path: str = StoreConfig.db_path):
        self.run = RunDir(Path(run_dir))
        self.store = StoreReader(self.run.root / Path(db_path).expanduser())
        self.trainer_log = JsonlTail(self.run.metrics_path("trainer"))
        self.worker_logs: dict[str, JsonlTail] = {}
        self.records = RunRecords()
        self._eval_files: set[str] = set()

    def refresh(self) -> RunRecords:
        # the store first: a batch the trainer's log names is always already read
        trajs, batches = self.store.read()
        rounds = [r for r in map(trainer_round, self.trainer_log.read()) if r is not None]
        r = self.records
        self.records = RunRecords(trajectories=r.trajectories + tuple(trajs), batches=r.batches + tuple(batches),
                                  rounds=r.rounds + tuple(rounds), syncs=r.syncs + tuple(self._syncs()),
                                  evals=tuple(sorted(r.evals + tuple(self._evals()), key=lambda e: e.time)))
        return self.records

    def _syncs(self) -> list[WorkerSync]:
        for path in sorted((self.run.root / "metrics").glob("rollout-*.jsonl")):
            self.worker_logs.setdefault(path.stem.removeprefix("rollout-"), JsonlTail(path))
        return [s for worker, tail in self.worker_logs.items()
                for s in (worker_sync(worker, line) for line in tail.read()) if s is not None]

    def _evals(self) -> list[EvalResult]:
        found = []
        for path in sorted((self.run.root / "eval").glob("*.json")):
            if path.name not in self._eval_files and (results := eval_results(path)) is not None:
                self._eval_files.add(path.name)
                found += results
        return found

    def close(self) -> None:
        self.store.close()
