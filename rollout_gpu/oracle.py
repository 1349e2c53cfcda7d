"""A policy that plays the environment's DOM-reading oracle: demonstrations as model text.

Its log-probs are zeros because no sampler produced the tokens; such trajectories are SFT
data and experience-pool entries (source "demo"), never importance-weighted.
"""

from __future__ import annotations

import numpy as np

from dart_jax.agent.prompt import Prompt, PromptBuilder
from dart_jax.wire.messages import EnvObservation, TaskSpec
from envs import oracle
from envs.types import Observation
from rollout_gpu.episode import Sample


class OraclePolicy:
    def __init__(self, builder: PromptBuilder):
        self.builder = builder

    async def sample(self, prompt: Prompt, observation: EnvObservation, task: TaskSpec) -> Sample:
        obs = Observation(screenshot=observation.screenshot, width=observation.width,
                          height=observation.height, instruction=observation.instruction,
                          dom_text=observation.dom_text)
        text = oracle.act(task.backend, task.name, obs)
        ids = self.builder.response_ids(text)
        return Sample(text=text, token_ids=ids, logprobs=np.zeros(len(ids), np.float32), policy_version=0)
