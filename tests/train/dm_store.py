"""A data manager whose store holds screenshot-free rollouts of two tasks, for trainer runs
that talk to a real data manager (resume, stall, multi-host), and `dart-jax train`
processes against it."""

import dataclasses
import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np

from dart_jax.config import dump
from dart_jax.data.config import CurationConfig, DataManagerConfig, TaskEntry, TaskSourceConfig
from dart_jax.data.service import serve
from dart_jax.run.schema import RunConfig
from dart_jax.run.config import PolicySection, RunSection
from dart_jax.testing.trajectories import text_trajectory
from dart_jax.train.config import BucketConfig, CheckpointConfig, OptimizerConfig, TrainerConfig
from dart_jax.wire import Client, WireConfig
from dart_jax.wire.messages import SubmitTrajectory
from dart_jax.wire.config import WeightSyncConfig

TASKS = tuple(TaskEntry(task_id=f"t{i}", backend="synthetic", name="click-button", seed=i) for i in range(2))


def dm_config(ipc: str | WireConfig) -> DataManagerConfig:
    # every rollout stays fresh: trainers' version numbers differ (restarts republish)
    curation = CurationConfig(tasks_per_batch=2, group_size=4, max_staleness=1000)
    wire = ipc if isinstance(ipc, WireConfig) else WireConfig(endpoint=ipc)
    return DataManagerConfig(wire=wire, curation=curation, tasks=TaskSourceConfig(tasks=TASKS))


def fill(root, n: int = 48) -> None:
    """`n` rollouts of the two tasks (a third of them successes) into a store under `root`."""
    stop = threading.Event()
    cfg = dm_config(f"ipc://{root}/dm.sock")
    thread = threading.Thread(target=serve, args=(cfg, root, stop), daemon=True)
    thread.start()
    rng = np.random.default_rng(0)
    with Client(cfg.wire) as client:
        for i in range(n):
            client.request(SubmitTrajectory(trajectory=text_trajectory(rng, f"r{i}", f"t{i % 2}", float(i % 3 == 0), prompt_len=(20, 120), response_len=(4, 30))),
                           timeout_s=60)
    stop.set()
    thread.join()


def serve_copy(store, root, wire: WireConfig | None = None) -> tuple[DataManagerConfig, threading.Event]:
    """A data manager on a copy of `store` at `root` (on `wire`, else a socket there); set the event to stop it."""
    shutil.copytree(store, root, ignore=shutil.ignore_patterns("*.sock"))
    stop = threading.Event()
    cfg = dm_config(wire or f"ipc://{root}/dm.sock")
    threading.Thread(target=serve, args=(cfg, root, stop), daemon=True).start()
    return cfg, stop


def rl_trainer(tmp_path: Path, name: str, store, tiny_dir, run: TrainerConfig,
               checkpoint: CheckpointConfig) -> tuple[Path, threading.Event]:
    """A data manager on a copy of `store` at tmp_path/name, and the config file of a
    one-process RL trainer against it (run directory tmp_path/name; its run settings from `run`)."""
    root = tmp_path / name
    dm, stop = serve_copy(store, root)
    loop = WireConfig(endpoint="tcp://127.0.0.1:0")
    cfg = RunConfig(run=RunSection(name=name, root=str(tmp_path)), policy=PolicySection(hf_dir=str(tiny_dir)),
                    data=dm, weights=WeightSyncConfig(announce=loop, serve=loop),
                    trainer=dataclasses.replace(run, mode="rl", optimizer=OptimizerConfig(lr=1e-4),
                                                buckets=BucketConfig((128, 256), (64,), 4), checkpoint=checkpoint))
    path = root / "trainer.yaml"
    path.write_text(dump(cfg))
    return path, stop


def train(config: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "dart_jax.cli", "train", str(config)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def records(run_dir: Path) -> list[dict]:
    """The trainer's metrics lines (none before its first)."""
    path = run_dir / "metrics" / "trainer.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
