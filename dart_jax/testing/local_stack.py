"""A live system on loopback for tests, benchmarks and experiments.

    with LocalStack(run_dir, hf_dir, tasks, cfg) as stack:   # data manager + env server here
        stack.start_worker("w0")                             # `dart-jax rollout`, a process
        stack.wait(lambda s: s.trajectories >= 8)
        stack.publish(params)                                # the caller owns the weights
        trajs = stack.trajectories()

The data manager, the env server and the weight publisher run in this process, on ports
the OS picks, so the caller can change weights, corrupt buckets or stop the publisher at
will; rollout workers run as their own processes, as in a deployment, so they can be
killed. Every endpoint is loopback.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

from dart_jax.config import dump
from dart_jax.data.config import TaskEntry, TaskSourceConfig
from dart_jax.data.service import DataManager
from dart_jax.models.hf_io import read_config
from dart_jax.run.launchers.shm_ledger import kill_and_release
from dart_jax.run.schema import RunConfig
from dart_jax.rundir import RunDir
from dart_jax.train.publish import WeightPublisher
from dart_jax.wire import Client, Server, WireConfig
from dart_jax.wire.messages import DataStats, StatsRequest, TaskSpec, Trajectory
from dart_jax.wire.process_groups import spawn
from envs.server import serving

LOOPBACK = WireConfig(endpoint="tcp://127.0.0.1:0")


class LocalStack:
    def __init__(self, run_dir: Path, hf_dir: Path, tasks: Sequence[TaskSpec], cfg: RunConfig = RunConfig()):
        self.run = RunDir.create(run_dir)
        self.hf_dir = Path(hf_dir)
        entries = tuple(TaskEntry(**{f: getattr(t, f) for f in t.__struct_fields__}) for t in tasks)
        self.cfg = dataclasses.replace(
            cfg, data=dataclasses.replace(cfg.data, wire=_loopback(cfg.data.wire),
                                          tasks=TaskSourceConfig(tasks=entries)),
            envs=dataclasses.replace(cfg.envs, wire=_loopback(cfg.envs.wire)),
            weights=dataclasses.replace(cfg.weights, announce=_loopback(cfg.weights.announce),
                                        serve=_loopback(cfg.weights.serve)))
        self.workers: dict[str, subprocess.Popen] = {}

    # -- the in-process roles
    def __enter__(self) -> "LocalStack":
        self.data = DataManager(self.cfg.data, self.run.root)
        self.data_server = Server(self.cfg.data.wire, self.data.handle, role="data-manager",
                                  workers=self.cfg.data.store.handler_threads, info=self.data.info).start()
        self._envs = serving(self.cfg.envs)
        self.env_server, self.env_wire = self._envs.__enter__()
        self.publisher = self._publisher()
        return self

    def _publisher(self) -> WeightPublisher:
        return WeightPublisher(self.cfg.weights, read_config(self.hf_dir), state_file=self.run.root / "weights.json")

    def restart_publisher(self) -> WeightPublisher:
        """A new publisher (a restarted trainer) on the same endpoints, numbering on."""
        self.publisher.close()
        self.cfg = dataclasses.replace(self.cfg, weights=self.worker_weights())
        self.publisher = self._publisher()
        return self.publisher

    def __exit__(self, *exc) -> None:
        for worker_id in list(self.workers):
            self.stop_worker(worker_id)
        self.publisher.close()
        self._envs.__exit__(None, None, None)
        self.data_server.stop()
        self.data.close()

    def publish(self, params) -> int:
        return self.publisher.publish(params)

    # -- workers
    def worker_weights(self):
        w = self.cfg.weights
        return dataclasses.replace(w, announce=dataclasses.replace(w.announce, endpoint=self.publisher.pub.endpoint),
                                   serve=dataclasses.replace(w.serve, endpoint=self.publisher.server.endpoint))

    def worker_config(self, worker_id: str) -> RunConfig:
        return dataclasses.replace(
            self.cfg, run=dataclasses.replace(self.cfg.run, root=str(self.run.root.parent), name=self.run.root.name),
            policy=dataclasses.replace(self.cfg.policy, hf_dir=str(self.hf_dir)),
            data=dataclasses.replace(self.cfg.data, wire=_at(self.cfg.data.wire, self.data_server.endpoint)),
            envs=dataclasses.replace(self.cfg.envs, wire=_at(self.cfg.envs.wire, self.env_wire.endpoint)),
            rollout=dataclasses.replace(self.cfg.rollout, worker_id=worker_id),
            weights=self.worker_weights())

    def start_worker(self, worker_id: str) -> subprocess.Popen:
        config = self.run.root / f"{worker_id}.yaml"
        config.write_text(dump(self.worker_config(worker_id)))
        out = open(self.run.log_path(f"{worker_id}.out"), "ab")
        proc = spawn([sys.executable, "-m", "dart_jax.cli", "rollout", str(config)],
                     stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        out.close()
        self.workers[worker_id] = proc
        return proc

    def kill_worker(self, worker_id: str) -> None:
        """SIGKILL the worker and everything it started (its vLLM engine processes)."""
        proc = self.workers.pop(worker_id)
        kill_and_release(proc.pid)
        proc.wait()

    def stop_worker(self, worker_id: str, grace_s: float = 30.0) -> int:
        proc = self.workers.pop(worker_id)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            kill_and_release(proc.pid)
            proc.wait()
        return proc.returncode

    def worker_log(self, worker_id: str) -> str:
        return self.run.log_path(f"{worker_id}.out").read_text(errors="replace")

    # -- what the data manager holds
    def stats(self) -> DataStats:
        with Client(self.data_server_wire()) as client:
            return client.request(StatsRequest())

    def data_server_wire(self) -> WireConfig:
        return _at(self.cfg.data.wire, self.data_server.endpoint)

    def trajectories(self) -> list[Trajectory]:
        store = self.data.store
        return store.load_trajectories([row[0] for row in store.query("SELECT traj_id FROM trajectories ORDER BY seq")])

    def wait(self, done: Callable[[DataStats], bool], timeout_s: float, what: str = "") -> DataStats:
        """Poll the data manager until `done(stats)`; fail with the workers' logs otherwise."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            stats = self.stats()
            if done(stats):
                return stats
            dead = [w for w, p in self.workers.items() if p.poll() is not None]
            if dead:
                raise RuntimeError(f"worker {dead[0]} exited: {self.worker_log(dead[0])[-4000:]}")
            time.sleep(0.5)
        raise TimeoutError(f"waited {timeout_s} s for {what or done}; last stats {stats}; "
                           f"logs: {[self.worker_log(w)[-2000:] for w in self.workers]}")


def _loopback(wire: WireConfig) -> WireConfig:
    return dataclasses.replace(wire, endpoint=LOOPBACK.endpoint)


def _at(wire: WireConfig, endpoint: str) -> WireConfig:
    return dataclasses.replace(wire, endpoint=endpoint)
