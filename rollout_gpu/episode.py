"""One agent episode: prompt -> policy sample -> env step, until done or the step cap.

Every step records exactly what the policy saw and produced: the prompt token ids (image
pads expanded), which screenshots were in the prompt, the response ids, the sampler's
log-probs and the policy version. The policy is anything with `sample` (a vLLM engine,
an oracle writing demonstrations), so one loop serves rollouts and demonstrations.
"""

from __future__ import annotations

import dataclasses
import io
import time
import uuid
from typing import Protocol

import numpy as np
from PIL import Image

from dart_jax.agent.prompt import Prompt, PromptBuilder
from dart_jax.wire.messages import EnvObservation, EnvReply, Step, TaskSpec, Trajectory


@dataclasses.dataclass(frozen=True)
class Sample:
    text: str
    token_ids: np.ndarray  # int32 [R]
    logprobs: np.ndarray  # float32 [R]: the sampler's log-probs of token_ids
    policy_version: int  # the version of the first token
    straddles_update: bool = False  # a weight update landed between its tokens


class Policy(Protocol):
    async def sample(self, prompt: Prompt, observation: EnvObservation, task: TaskSpec) -> Sample: ...


class EnvSession(Protocol):
    async def reset(self, task: TaskSpec) -> EnvReply: ...

    async def step(self, action_text: str) -> EnvReply: ...

    async def evaluate(self): ...


def _image(png: bytes) -> Image.Image:
    return Image.open(io.BytesIO(png)).convert("RGB")


async def run_episode(env: EnvSession, task: TaskSpec, policy: Policy, builder: PromptBuilder, *,
                      max_steps: int, worker_id: str = "", temperature: float = 1.0,
                      source: str = "rollout", assignment_id: str = "", env_slot: str = "") -> Trajectory:
    """Play `task` on a leased env slot and return the finished trajectory, with the
    wall-clock span of every model call, env step, reset and evaluation."""
    reset_start = time.time()
    reply = await env.reset(task)
    reset_s = (reset_start, time.time())
    screenshots, images, responses, steps = [], [], [], []
    status = "env_error" if reply.status == "env_error" else None
    while status is None and reply.observation is not None:
        obs = reply.observation
        screenshots.append(obs.screenshot)
        images.append(_image(obs.screenshot))
        if reply.done or len(steps) == max_steps:
            break
        prompt = builder.build(obs.instruction, images, responses, obs.dom_text)
        gen_start = time.time()
        sample = await policy.sample(prompt, obs, task)
        env_start = time.time()
        reply = await env.step(sample.text)
        timing = ((gen_start, env_start), (env_start, time.time()))
        steps.append(_step(prompt, sample, reply, len(images) - len(prompt.images), timing))
        responses.append(sample.text)
        if reply.status == "env_error":
            status = "env_error"
    eval_start = time.time()
    result = await env.evaluate() if status is None else None
    evaluate_s = (eval_start, time.time()) if result is not None else (0.0, 0.0)
    reward = result.reward if result is not None else 0.0
    if status is None:
        truncated = not reply.done and len(steps) == max_steps
        status = "truncated" if truncated and result.status != "success" else result.status
    return Trajectory(traj_id=uuid.uuid4().hex, task_id=task.task_id, steps=steps,
                      screenshots=screenshots, reward=reward, status=status, worker_id=worker_id,
                      temperature=temperature, created_at=time.time(), source=source,
                      assignment_id=assignment_id, env_slot=env_slot, reset_s=reset_s,
                      evaluate_s=evaluate_s)


def _step(prompt: Prompt, sample: Sample, reply: EnvReply, first_image: int, timing) -> Step:
    return Step(prompt_ids=prompt.token_ids.astype(np.int32), response_ids=sample.token_ids.astype(np.int32),
                logprobs=sample.logprobs.astype(np.float32),
                image_refs=list(range(first_image, first_image + len(prompt.images))),
                policy_version=sample.policy_version, response_text=sample.text,
                action=reply.action, valid=reply.status != "invalid",
                straddles_update=sample.straddles_update, gen_s=timing[0], env_s=timing[1])
