"""Oracle demonstrations through the env server: the experience pool's first entries.

The oracle reads each observation's DOM text (envs.oracle) and writes its action as model
text, so a demonstration is recorded exactly as a rollout is (prompt ids, response ids,
screenshots); its log-probs are zeros because no sampler produced the tokens: such
trajectories are SFT data and experience-pool entries (source "demo"), never
importance-weighted. `concurrency` sessions each lease a slot and play tasks off one
shared queue, so the env server's slots stay busy while prompts are built.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Sequence

import numpy as np

from dart_jax.agent.prompt import Prompt, PromptBuilder
from dart_jax.wire import RemoteError, WireConfig
from dart_jax.wire.messages import EnvObservation, TaskSpec, Trajectory
from envs import oracle
from dart_jax.wire.env_client import EnvPool, EnvSession
from envs.types import Observation
from rollout_gpu.episode import Sample, run_episode

log = logging.getLogger(__name__)


class OraclePolicy:
    """The env's DOM-reading oracle as a policy of the episode loop."""

    def __init__(self, builder: PromptBuilder):
        self.builder = builder

    async def sample(self, prompt: Prompt, observation: EnvObservation, task: TaskSpec) -> Sample:
        obs = Observation(screenshot=observation.screenshot, width=observation.width,
                          height=observation.height, instruction=observation.instruction,
                          dom_text=observation.dom_text)
        text = oracle.act(task.backend, task.name, obs, prompt.responses)
        ids = self.builder.response_ids(text)
        return Sample(text=text, token_ids=ids, logprobs=np.zeros(len(ids), np.float32), policy_version=0)


async def collect(env_wire: WireConfig, tasks: Sequence[TaskSpec], builder: PromptBuilder, *,
                  max_steps: int, concurrency: int, slot_wait_s: float = 600.0) -> list[Trajectory]:
    """One oracle episode per task; returns every trajectory (successes and the rest).

    A task whose backend has no free slot goes back to the end of the queue and the session
    plays the next one, so a backend whose few slots stay leased (an episode stuck until the
    env server's deadline, a slot held until its lease is reaped) holds up only its own tasks;
    a task that finds no slot for `slot_wait_s` in all raises the env server's `unavailable`."""
    queue: asyncio.Queue[TaskSpec] = asyncio.Queue()
    for task in tasks:
        queue.put_nowait(task)
    pool = EnvPool([env_wire], client_id="demos")
    policy = OraclePolicy(builder)
    done: list[Trajectory] = []
    first_try: dict[str, float] = {}

    async def lease(task: TaskSpec) -> EnvSession | None:
        """A slot for `task`, or None when its backend is busy and the task was put back."""
        try:
            return await pool.acquire(task.backend, wait_s=0.0)
        except RemoteError as e:
            waited = time.monotonic() - first_try.setdefault(task.task_id, time.monotonic())
            if e.code != "unavailable" or waited > slot_wait_s:
                raise
        queue.put_nowait(task)
        await asyncio.sleep(0.05)
        return None

    async def worker() -> None:
        while not queue.empty():
            task = queue.get_nowait()
            if (session := await lease(task)) is None:
                continue
            async with session as env:
                traj = await run_episode(env, task, policy, builder, max_steps=max_steps,
                                         worker_id="demos", source="demo")
                log.info("demo %s: %s reward %.2f in %d steps", task.task_id, traj.status,
                         traj.reward, len(traj.steps))
                done.append(traj)

    try:
        await asyncio.gather(*(worker() for _ in range(min(concurrency, len(tasks)))))
    finally:
        await pool.aclose()
    return done
