"""What every benchmark shares: the machine it ran on, its work directory, workers in fresh
processes and in-process rollout workers."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path


def spread(values: list[float]) -> dict[str, float]:
    """p50, p95 and max of `values` (nearest rank: p95 of 10 values is the 10th)."""
    ranked = sorted(values)
    rank = lambda q: ranked[min(len(ranked) - 1, math.ceil(q * len(ranked)) - 1)]
    return {"p50": rank(0.50), "p95": rank(0.95), "max": ranked[-1]}


def machine(device: bool = False) -> dict:
    """The machine a figure was measured on: host, CPU model, cores, memory, Python. With
    `device`, also JAX's backend, first device and device count (`device_info`), asked in this
    process where it already imported JAX, else in a child process: a driver leaves the device
    to its workers (on a GPU, JAX takes 75% of its memory at its first device query)."""
    info = {"host": platform.node(), "cpu": _cpu_model(), "cores": os.cpu_count(), "memory_gib": _memory_gib(),
            "python": platform.python_version()}
    if not device:
        return info
    if "jax" in sys.modules:
        return info | device_info()
    probe = "import json; from benchmarks.common import device_info; print(json.dumps(device_info()))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, check=True)
    return info | json.loads(out.stdout.strip().splitlines()[-1])


def commit() -> str:
    """The checkout's commit (short), "+changes" where tracked files differ from it; "unknown"
    outside a git checkout."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return out.stdout.strip() + ("+changes" if dirty else "")


def device_info() -> dict:
    """JAX's backend, its first device's kind, the device count and JAX's version, from this process."""
    import jax  # only where asked: it starts the backend

    return {"backend": jax.default_backend(), "device": jax.devices()[0].device_kind, "devices": jax.device_count(),
            "jax": jax.__version__}


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError):
        return None


@contextlib.contextmanager
def work_dir(given: str | os.PathLike | None, prefix: str) -> Iterator[Path]:
    """Where a benchmark writes: `given` (kept), or a new temporary directory removed when the
    benchmark ends, however it ends: an exception, Ctrl-C or a SIGTERM (`timeout`, a job
    scheduler), which ends it through SystemExit. One 0.5B weight_sync run writes 2-4 GB."""
    if given is not None:
        yield Path(given)
        return
    from dart_jax.run.main import stop_on_sigterm
    stop_on_sigterm()  # a SIGTERM unwinds through the removal below
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


OOM_MARKERS = ("RESOURCE_EXHAUSTED", "OutOfMemoryError", "out of memory")
LOG_TAIL = 2000  # characters of a failed worker's output kept with its result


def run_worker(module: str, payload: dict, timeout: float) -> dict:
    """`python -m module --worker JSON` in a fresh process (its own allocator: an
    out-of-memory or a hang ends only this measurement). Every JSON object line the worker
    printed merges into the result in order (a worker may print a plan, such as XLA's memory
    analysis, before it runs), with `status`: "ok", "out of memory", "timeout after N s" or
    "failed: <last line>". The worker's stderr goes on to this process's stderr."""
    cmd = [sys.executable, "-m", module, "--worker", json.dumps(payload)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        stdout, stderr = _text(e.stdout), _text(e.stderr)
        _relay(stderr)
        return {**_json_lines(stdout), "status": f"timeout after {timeout:.0f} s"}
    _relay(out.stderr)
    figures = _json_lines(out.stdout)
    if out.returncode == 0 and figures:
        return {**figures, "status": "ok"}
    log = (out.stderr or out.stdout).strip()
    last = log.splitlines()[-1:] or [f"exit {out.returncode}"]
    oom = any(m in out.stderr for m in OOM_MARKERS)
    return {**figures, "status": "out of memory" if oom else f"failed: {last[0][:300]}", "log_tail": log[-LOG_TAIL:]}


def _text(x) -> str:
    return x.decode(errors="replace") if isinstance(x, bytes) else (x or "")


def _relay(stderr: str) -> None:
    if stderr:
        sys.stderr.write(stderr[-20 * LOG_TAIL:])
        sys.stderr.flush()


def _json_lines(stdout: str) -> dict:
    merged = {}
    for line in stdout.splitlines():
        if line.startswith("{"):
            try:
                merged |= json.loads(line)
            except json.JSONDecodeError:
                continue
    return merged


def socket_overrides(root, name: str) -> list[str]:
    """`dart-jax run` overrides putting every endpoint of run `name` on ipc sockets under
    `root`: no port another run or test could hold."""
    sock = lambda role: f"ipc://{root}/{name}-{role}.sock"  # noqa: E731
    return [f"envs.wire.endpoint={sock('envs')}", f"data.wire.endpoint={sock('dm')}",
            f"weights.announce.endpoint={sock('announce')}", f"weights.serve.endpoint={sock('weights')}"]


def union_s(intervals, start: float, end: float) -> float:
    """Seconds of [start, end] covered by the union of (a, b) intervals."""
    covered, reach = 0.0, start
    for a, b in sorted((max(a, start), min(b, end)) for a, b in intervals):
        if b > reach:
            covered += b - max(a, reach)
            reach = b
    return covered


@contextlib.asynccontextmanager
async def running_worker(stack, engine, worker_id: str = "bench", **rollout):
    """A rollout worker in this process on `engine`, against `stack`, until the block ends."""
    from dart_jax.agent.prompt import PromptBuilder
    from rollout_gpu.worker import Worker
    cfg = stack.worker_config(worker_id)
    worker = Worker(dataclasses.replace(cfg.rollout, **rollout), engine, PromptBuilder.from_pretrained(stack.hf_dir, cfg.rollout.prompt),
                    cfg.data.wire, [cfg.envs.wire], cfg.weights)
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        yield worker
    finally:
        stop.set()
        await task

