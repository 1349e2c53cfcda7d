import threading
from pathlib import Path

import pytest

from dart_jax.config import from_dict
from dart_jax.data import service
from dart_jax.data.config import DataManagerConfig
from dart_jax.data.store import Store
from dart_jax.data.tasks import write_task_file
from dart_jax.testing.trajectories import task_specs
from dart_jax.wire import Client


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "data" / "store.sqlite", tmp_path / "data" / "blobs")
    s.upsert_tasks(task_specs(n_train=10, n_eval=2))
    yield s
    s.close()


@pytest.fixture
def serve_manager():
    """`serve_manager(run_dir, **config)` -> a Client of a data manager serving `run_dir`
    (tasks t0, t1 and eval e0 from tasks.jsonl, t9 inline; `config` merged over that).
    Stopped after the test."""
    running = []

    def start(run_dir: Path, **config) -> Client:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_task_file(run_dir / "tasks.jsonl", task_specs(n_train=2, n_eval=1))
        cfg = from_dict(DataManagerConfig, {
            "wire": {"endpoint": f"ipc://{run_dir}/dm.sock", "timeout_s": 10},
            "tasks": {"task_file": "tasks.jsonl",
                      "tasks": [{"task_id": "t9", "backend": "synthetic", "name": "inline"}]},
            "curation": {"tasks_per_batch": 2, "group_size": 4}, **config})
        stop = threading.Event()
        thread = threading.Thread(target=service.serve, args=(cfg, run_dir, stop))
        thread.start()
        client = Client(cfg.wire)
        running.append((client, stop, thread))
        return client

    yield start
    for client, stop, thread in running:
        client.close()
        stop.set()
        thread.join()
