"""What every benchmark shares: the machine line and in-process rollout workers."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import platform


def machine() -> str:
    """The machine a figure was measured on, in one line."""
    cpu = platform.processor() or platform.machine()
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        mem = float("nan")
    return f"{platform.node()} {cpu}, {os.cpu_count()} cores, {mem:.0f} GiB, Python {platform.python_version()}"


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

