"""Crash safety: kill -9 the data manager mid-ingest, restart it, lose and duplicate nothing.

Four clients ingest 1,000 trajectories (10 steps, 10 screenshots each), retrying every
request that times out. At a random moment the service process gets SIGKILL. Then:
every trajectory acknowledged before the kill is in the store (checked before the
restart), the store passes its integrity check, and after the restart and the clients'
retries each trajectory is stored exactly once with exactly the bytes that were sent.
"""

import os
import random
import signal
import subprocess
import sys
import threading
import time

import yaml

from dart_jax.data import integrity
from dart_jax.data.store import Store
from dart_jax.data.tasks import write_task_file
from dart_jax.testing.trajectories import make_trajectory, task_specs
from dart_jax.wire import Client, RemoteError, WireConfig, WireTimeout, to_bytes
from dart_jax.wire.messages import SubmitTrajectory

CLIENTS, PER_CLIENT = 4, 250


def trajectory(c: int, i: int):
    return make_trajectory(f"c{c}-{i:04d}", f"t{i % 4}", success=i % 3 == 0, steps=10,
                           screenshot_bytes=4096, prompt_len=64, response_len=16, version=i // 100)


def start(run_dir, log):
    return subprocess.Popen([sys.executable, "-m", "dart_jax.data.service", "--run-dir", str(run_dir),
                             "--config", str(run_dir / "dm.yaml")], stdout=log, stderr=log)


class Ingester(threading.Thread):
    def __init__(self, c: int, wire: WireConfig):
        super().__init__(daemon=True)
        self.c, self.wire = c, wire
        self.acked: list[str] = []
        self.duplicates = 0
        self.retries_dup: list[bool] = []

    def send(self, client: Client, traj) -> bool:
        while True:
            try:
                return client.request(SubmitTrajectory(trajectory=traj), timeout_s=2.0).duplicate
            except (WireTimeout, RemoteError):
                time.sleep(0.05)  # the service is down or restarting: retry the same trajectory

    def run(self) -> None:
        with Client(self.wire) as client:
            for i in range(PER_CLIENT):
                self.duplicates += self.send(client, trajectory(self.c, i))
                self.acked.append(f"c{self.c}-{i:04d}")
            self.retries_dup = [self.send(client, trajectory(self.c, i)) for i in range(5)]


def test_kill_9_mid_ingest_loses_and_duplicates_nothing(tmp_path):
    seed = random.randrange(1 << 30)
    kill_at = random.Random(seed).randrange(150, 650)
    write_task_file(tmp_path / "tasks.jsonl", task_specs(n_train=4))
    wire = WireConfig(endpoint=f"ipc://{tmp_path}/dm.sock", timeout_s=5)
    (tmp_path / "dm.yaml").write_text(yaml.safe_dump(
        {"wire": {"endpoint": wire.endpoint}, "tasks": {"task_file": "tasks.jsonl"}}))
    log = open(tmp_path / "service.log", "ab")
    proc = start(tmp_path, log)
    clients = [Ingester(c, wire) for c in range(CLIENTS)]
    for c in clients:
        c.start()

    deadline = time.monotonic() + 60
    while sum(len(c.acked) for c in clients) < kill_at:
        assert time.monotonic() < deadline and proc.poll() is None, f"stalled (seed {seed})"
        time.sleep(0.002)
    os.kill(proc.pid, signal.SIGKILL)
    acked_before = {t for c in clients for t in c.acked}
    proc.wait()

    store = Store(tmp_path / "data" / "store.sqlite", tmp_path / "data" / "blobs")
    stored = {r[0] for r in store.query("SELECT traj_id FROM trajectories")}
    assert acked_before <= stored, f"acknowledged but lost: {sorted(acked_before - stored)[:5]} (seed {seed})"
    assert integrity.check(store, deep=True) == [], f"seed {seed}"
    print(f"seed {seed}: killed after {len(acked_before)} acks with {len(stored)} stored, "
          f"{integrity.orphan_bytes(store)} orphan pack bytes")
    store.close()

    proc = start(tmp_path, log)
    for c in clients:
        c.join(timeout=max(1, deadline - time.monotonic()))
        assert not c.is_alive(), f"client {c.c} did not finish (seed {seed})"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0

    assert all(c.retries_dup == [True] * 5 for c in clients)  # retries of acked work duplicate nothing
    store = Store(tmp_path / "data" / "store.sqlite", tmp_path / "data" / "blobs")
    assert store.query("SELECT count(*), count(DISTINCT traj_id) FROM trajectories") == [(1000, 1000)]
    assert store.query("SELECT count(*) FROM steps") == [(10_000,)]
    assert integrity.check(store, deep=True) == [], f"seed {seed}"
    for c in range(CLIENTS):
        ids = [f"c{c}-{i:04d}" for i in range(PER_CLIENT)]
        back = store.load_trajectories(ids)
        assert [to_bytes(t) for t in back] == [to_bytes(trajectory(c, i)) for i in range(PER_CLIENT)]
    store.close()
