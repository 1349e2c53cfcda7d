"""Oracle demonstrations through the env server: the experience pool's first entries.

`concurrency` sessions each lease a slot and play tasks off one shared queue, so the
env server's slots stay busy while prompts are built (the decoupling DART relies on).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Sequence

from dart_jax.agent.prompt import PromptBuilder
from dart_jax.wire import WireConfig
from dart_jax.wire.messages import TaskSpec, Trajectory
from envs.client import EnvClient
from rollout_gpu.episode import run_episode
from rollout_gpu.oracle import OraclePolicy

log = logging.getLogger(__name__)


async def collect(env_wire: WireConfig, tasks: Sequence[TaskSpec], builder: PromptBuilder, *,
                  max_steps: int, concurrency: int) -> list[Trajectory]:
    """One oracle episode per task; returns every trajectory (successes and the rest)."""
    queue: asyncio.Queue[TaskSpec] = asyncio.Queue()
    for task in tasks:
        queue.put_nowait(task)
    client = EnvClient(env_wire, client_id="demos")
    policy = OraclePolicy(builder)
    done: list[Trajectory] = []

    async def worker() -> None:
        while not queue.empty():
            task = queue.get_nowait()
            async with await client.acquire(task.backend) as env:
                traj = await run_episode(env, task, policy, builder, max_steps=max_steps,
                                         worker_id="demos", source="demo")
                log.info("demo %s: %s reward %.2f in %d steps", task.task_id, traj.status,
                         traj.reward, len(traj.steps))
                done.append(traj)

    try:
        await asyncio.gather(*(worker() for _ in range(min(concurrency, len(tasks)))))
    finally:
        await client.aclose()
    return done
