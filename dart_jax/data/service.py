"""`dart-jax data-manager`: the process that owns the run's store (no JAX import).

    python -m dart_jax.data.service --run-dir runs/local [--config data.yaml] [key=value ...]

Serves, on one ROUTER socket (`cfg.wire.endpoint`):
  TaskRequest -> TaskAssignment | NoTask        rollout workers: next task, rollouts, step limit
  WorkerHeartbeat -> WorkerAck                  a worker's assignments stay out while it beats
  SubmitTrajectory -> TrajectoryAck             after commit; idempotent by traj_id
  BatchRequest -> CuratedBatch | NoBatch        the trainer: curated GRPO groups, replayable
  ScreenshotRequest -> Screenshots              the trainer: a batch's screenshots by hash
  StatsRequest -> DataStats                     dashboards
  PoolImport -> PoolImported                    successes into the pool (path: dart_jax.wire.paths)
  ExportTrajectories -> Exported                to a new file or directory (path: same rules)
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import signal
import threading
import time
from pathlib import Path

from dart_jax.config import apply_overrides, from_dict, load
from dart_jax.data import ingest, pool, stats
from dart_jax.data.batches import BatchAssembler, serve_screenshots
from dart_jax.data.config import DataManagerConfig
from dart_jax.data.scheduler import Scheduler
from dart_jax.data.store import ConflictError, NotFoundError, Store
from dart_jax.data.tasks import load_tasks
from dart_jax.wire import Server, paths
from dart_jax.wire.messages import (BatchRequest, Error, ExportTrajectories, Exported, Message,
                                    PoolImport, PoolImported, ScreenshotRequest, StatsRequest,
                                    SubmitTrajectory, TaskRequest, TrainerHeartbeat, TrainerStatus,
                                    TrainerStatusRequest, Trajectory, TrajectoryAck, WorkerAck, WorkerHeartbeat)

log = logging.getLogger(__name__)


class DataManager:
    """The request handler and the state behind it; `run` wires it to a server."""

    def __init__(self, cfg: DataManagerConfig, run_dir: Path, mode: str = "async"):
        """`mode`: "async" (DART: decoupled) or "sync" (rounds: rollouts of the newest version,
        then training on exactly them, then the next version)."""
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.store = Store.open(cfg.store, self.run_dir)
        self.store.upsert_tasks(load_tasks(cfg.tasks, self.run_dir))
        self.known_tasks = frozenset(t.task_id for t in self.store.tasks())
        self.import_roots = paths.roots(self.run_dir, cfg.request_paths.import_roots)
        self.export_roots = paths.roots(self.run_dir, cfg.request_paths.export_roots)
        for path in cfg.pool.import_paths:
            got = pool.import_pool(self.store, self.run_dir / path)
            log.info("pool import %s: %s", path, got)
        curation_cfg = dataclasses.replace(cfg.curation, max_staleness=0) if mode == "sync" else cfg.curation
        self.scheduler = Scheduler(self.store, curation_cfg, mode=mode)
        self.batches = BatchAssembler(self.store, curation_cfg, self.scheduler if mode == "sync" else None)
        self.latest_version = self.store.latest_version()
        self.writer = ingest.IngestWriter(self.store, cfg.store.group_commit_max, self._committed)
        self.trainer: tuple[float, TrainerHeartbeat] | None = None  # (when, the trainer's last heartbeat)

    def handle(self, msg: Message) -> Message:
        try:
            if isinstance(msg, SubmitTrajectory):
                return self.submit(msg.trajectory)
            if isinstance(msg, TaskRequest):
                self._saw_version(msg.policy_version, "rollout")
                return self.scheduler.next(self.latest_version, msg.worker_id, msg.session, msg.policy_version)
            if isinstance(msg, WorkerHeartbeat):
                self._saw_version(msg.policy_version, "rollout")
                return WorkerAck(known=self.scheduler.heartbeat(msg.worker_id, msg.session))
            if isinstance(msg, BatchRequest):
                self._saw_version(msg.trainer_version, "trainer")
                return self.batches.handle(msg)
            if isinstance(msg, ScreenshotRequest):
                # half the message limit: the reply's framing and the rest fit beside the PNGs
                return serve_screenshots(self.store, msg, self.cfg.wire.max_message_bytes // 2)
            if isinstance(msg, StatsRequest):
                return stats.collect(self.store, self.cfg.curation, msg.task_ids)
            if isinstance(msg, TrainerHeartbeat):
                self.trainer = (time.monotonic(), msg)
                return self.trainer_status()
            if isinstance(msg, TrainerStatusRequest):
                return self.trainer_status()
            if isinstance(msg, PoolImport):
                return self.import_pool(msg)
            if isinstance(msg, ExportTrajectories):
                return self.export(msg)
        except ValueError as e:
            return Error(code="bad_request", message=str(e))
        except (ConflictError, FileExistsError) as e:
            return Error(code="conflict", message=str(e))
        except NotFoundError as e:
            return Error(code="not_found", message=str(e))
        return Error(code="bad_request", message=f"the data manager does not serve {type(msg).__name__}")

    def trainer_status(self) -> TrainerStatus:
        if self.trainer is None:
            return TrainerStatus(seen_s_ago=None)
        at, beat = self.trainer
        return TrainerStatus(seen_s_ago=time.monotonic() - at, step=beat.step, policy_version=beat.policy_version,
                             state=beat.state)

    def submit(self, traj: Trajectory) -> TrajectoryAck:
        """Validate, append screenshots, queue for the group commit, and ack once committed."""
        ingest.validate(traj, self.known_tasks)
        if self.store.has_trajectory(traj.traj_id):
            return TrajectoryAck(traj_id=traj.traj_id, duplicate=True)
        refs = self.store.put_screenshots(traj)
        duplicate = self.writer.submit(traj, refs).result()
        return TrajectoryAck(traj_id=traj.traj_id, duplicate=duplicate)

    def import_pool(self, msg: PoolImport) -> PoolImported:
        path = paths.confine(msg.path, self.run_dir, self.import_roots)
        got = pool.import_pool(self.store, path, allowed=self.import_roots)
        return PoolImported(imported=got.imported, duplicates=got.duplicates, skipped=got.skipped)

    def export(self, msg: ExportTrajectories) -> Exported:
        path = paths.confine(msg.path, self.run_dir, self.export_roots)
        split = None if msg.split == "all" else msg.split
        count = pool.export(self.store, path, msg.format, msg.success_only, split)
        return Exported(path=str(path), count=count)

    def _committed(self, traj: Trajectory) -> None:
        self.scheduler.on_ingested(traj.task_id, traj.assignment_id)
        if traj.steps:
            self._saw_version(max(s.policy_version for s in traj.steps), None)

    def _saw_version(self, version: int, seen_by: str | None) -> None:
        if version > self.latest_version:
            self.latest_version = version
        if seen_by is not None and version >= 0:
            self.store.note_version(version, seen_by)

    def info(self) -> dict:
        return {"latest_version": self.latest_version, "tasks": len(self.known_tasks)}

    def close(self) -> None:
        self.writer.close()
        self.store.close()


def serve(cfg: DataManagerConfig, run_dir: Path, stop: threading.Event, mode: str = "async") -> None:
    """Serve until `stop` is set (tests and `run`)."""
    manager = DataManager(cfg, run_dir, mode)
    server = Server(cfg.wire, manager.handle, role="data-manager",
                    workers=cfg.store.handler_threads, info=manager.info).start()
    log.info("data manager serving %s (store %s)", server.endpoint, manager.store.db_path)
    try:
        stop.wait()
    finally:
        server.stop()
        manager.close()


def run(cfg: DataManagerConfig, run_dir: Path, mode: str = "async") -> None:
    """Block serving until SIGTERM or SIGINT."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    serve(cfg, run_dir, stop, mode)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m dart_jax.data.service", description=__doc__.split("\n")[0])
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--config", type=Path, help="YAML of a DataManagerConfig (defaults without)")
    parser.add_argument("overrides", nargs="*", help="dotted key=value overrides")
    args = parser.parse_args(argv)
    if args.config:
        cfg = load(DataManagerConfig, args.config, args.overrides)
    else:
        cfg = from_dict(DataManagerConfig, apply_overrides({}, args.overrides, "override"), "override")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s data-manager %(levelname)s %(message)s")
    run(cfg, args.run_dir)


if __name__ == "__main__":
    main()
