"""Data manager throughput: ingestion over ZeroMQ and curated batch assembly.

    python -m benchmarks.components.data_manager [--per-client 150] [--keep DIR]

1. ingest_traj_per_s: the service runs as its own process (`python -m dart_jax.data.service`);
   4 client processes each submit trajectories of 10 steps with a unique 50 KB screenshot
   per step (1,024 prompt + 64 response tokens a step), one at a time with the blocking
   client, each acknowledged only after its commit. Rate = all trajectories / wall time
   from the common start to the last ack. Target >= 200.
2. batch_assembly_s: the store is filled to 100,000 steps (stale filler from earlier policy
   versions plus the fresh trajectories of step 1), the service restarted, and one
   BatchRequest (8 tasks x 8 trajectories) timed at the client, from request to the
   decoded CuratedBatch and all its screenshots fetched by hash (ScreenshotRequest, as the
   trainer asks for them). Target <= 1 s.
Prints one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgspec
import yaml

from dart_jax.data.store import Store
from dart_jax.data.tasks import write_task_file
from dart_jax.testing.trajectories import make_trajectory, task_specs
from dart_jax.wire import Client, WireConfig
from dart_jax.wire.messages import (MAX_SCREENSHOTS_PER_REQUEST, BatchRequest, CuratedBatch, Ping,
                                    ScreenshotRequest, SubmitTrajectory)

CLIENTS, STEPS, SHOT_BYTES, PROMPT, RESPONSE = 4, 10, 50_000, 1024, 64
TASKS, VERSION, TARGET_STEPS = 8, 10, 100_000


def _traj(name: str, task: int, success: bool, version: int, shared: int = 0):
    return make_trajectory(name, f"t{task}", success=success, steps=STEPS, version=version,
                           screenshot_bytes=SHOT_BYTES, prompt_len=PROMPT, response_len=RESPONSE,
                           shared_screens=shared)


def _client(c: int, n: int, endpoint: str, ready, go, out) -> None:
    trajs = [_traj(f"c{c}-{i}", (c * n + i) % TASKS, i % 3 == 0, VERSION) for i in range(n)]
    msgs = [SubmitTrajectory(trajectory=t) for t in trajs]
    with Client(WireConfig(endpoint=endpoint, timeout_s=60)) as client:
        client.request(Ping())
        ready.release()
        go.wait()
        cpu = time.process_time()
        for m in msgs:
            assert not client.request(m).duplicate
        out.put((time.perf_counter(), time.process_time() - cpu))


def _start(run_dir: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "dart_jax.data.service", "--run-dir", str(run_dir),
                             "--config", str(run_dir / "dm.yaml")],
                            stdout=subprocess.DEVNULL, stderr=open(run_dir / "service.log", "ab"))
    return proc


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(timeout=60)


def bench_ingest(run_dir: Path, endpoint: str, per_client: int) -> float:
    proc = _start(run_dir)
    ctx = mp.get_context("spawn")
    ready, go, out = ctx.Semaphore(0), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_client, args=(c, per_client, endpoint, ready, go, out)) for c in range(CLIENTS)]
    for p in procs:
        p.start()
    for _ in procs:
        ready.acquire()
    start = time.perf_counter()
    go.set()
    ends, client_cpu = zip(*[out.get(timeout=600) for _ in procs])
    for p in procs:
        p.join()
    service_cpu = _cpu_seconds(proc.pid)
    _stop(proc)
    n = CLIENTS * per_client
    return n / (max(ends) - start), 1e3 * service_cpu / n, 1e3 * sum(client_cpu) / n


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a live process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def fill(run_dir: Path, steps_wanted: int) -> int:
    """Stale filler (versions 0..8, 64 shared screenshots) up to `steps_wanted` steps."""
    store = Store(run_dir / "data" / "store.sqlite", run_dir / "data" / "blobs")
    have = store.query("SELECT count(*) FROM steps")[0][0]
    template = _traj("filler", 0, False, 0, shared=64)
    digests = store.put_screenshots(template)
    n = (steps_wanted - have + STEPS - 1) // STEPS
    for start in range(0, n, 1000):
        with store.write() as w:
            for i in range(start, min(n, start + 1000)):
                t = msgspec.structs.replace(template, traj_id=f"filler-{i}", task_id=f"t{i % TASKS}",
                                            status="success" if i % 4 == 0 else "failure")
                store.insert_trajectory(w, t, digests)
    total = store.query("SELECT count(*) FROM steps")[0][0]
    store.close()
    return total


def bench_batch(run_dir: Path, endpoint: str) -> tuple[float, int, int]:
    proc = _start(run_dir)
    with Client(WireConfig(endpoint=endpoint, timeout_s=120)) as client:
        client.request(Ping(), timeout_s=60)
        t0 = time.perf_counter()
        batch = client.request(BatchRequest(trainer_version=VERSION, after_batch_id=0))
        assert isinstance(batch, CuratedBatch), batch
        shas = list(dict.fromkeys(r.sha256 for screens in batch.screens for r in screens))
        got = 0
        while got < len(shas):
            ask = shas[got:got + MAX_SCREENSHOTS_PER_REQUEST]
            got += len(client.request(ScreenshotRequest(sha256=ask)).png)
        seconds = time.perf_counter() - t0
    _stop(proc)
    return seconds, len({t.task_id for t in batch.trajectories}), len(batch.trajectories)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--per-client", type=int, default=150)
    parser.add_argument("--keep", type=Path, help="run directory to keep (default: a temporary one)")
    args = parser.parse_args()
    run_dir = args.keep or Path(tempfile.mkdtemp(prefix="dm-bench-"))
    run_dir.mkdir(parents=True, exist_ok=True)
    endpoint = f"ipc://{run_dir}/dm.sock"
    write_task_file(run_dir / "tasks.jsonl", task_specs(n_train=TASKS, n_eval=2))
    (run_dir / "dm.yaml").write_text(yaml.safe_dump({"wire": {"endpoint": endpoint}, "tasks": {"task_file": "tasks.jsonl"}}))
    try:
        rate, service_ms, client_ms = bench_ingest(run_dir, endpoint, args.per_client)
        stored = fill(run_dir, TARGET_STEPS)
        seconds, tasks, trajs = bench_batch(run_dir, endpoint)
    finally:
        if not args.keep:
            shutil.rmtree(run_dir, ignore_errors=True)
    print(json.dumps({
        "ingest_traj_per_s": round(rate, 1), "ingest_target": 200,
        "service_cpu_ms_per_traj": round(service_ms, 2), "client_cpu_ms_per_traj": round(client_ms, 2),
        "cpus": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2),
        "batch_assembly_s": round(seconds, 3), "batch_target_s": 1.0,
        "clients": CLIENTS, "ingested": CLIENTS * args.per_client, "steps_per_traj": STEPS,
        "screenshot_bytes": SHOT_BYTES, "prompt_tokens": PROMPT, "response_tokens": RESPONSE,
        "stored_steps": stored, "batch_tasks": tasks, "batch_trajectories": trajs}))


if __name__ == "__main__":
    main()
