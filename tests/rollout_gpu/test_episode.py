import asyncio

import numpy as np
import pytest

from dart_jax.agent.config import PromptConfig
from dart_jax.agent.prompt import PromptBuilder
from dart_jax.models.tiny import make_tiny_hf_dir
from dart_jax.wire import WireConfig
from dart_jax.wire.messages import TaskSpec
from dart_jax.wire.env_client import EnvClient
from envs.config import EnvServerConfig, SyntheticSlots
from envs.server import serving
from rollout_gpu.episode import Sample, run_episode


class FixedText:
    """A policy that always answers the same text, with made-up log-probs of version 7."""

    def __init__(self, builder, text):
        self.builder, self.text = builder, text

    async def sample(self, prompt, observation, task):
        ids = self.builder.response_ids(self.text)
        return Sample(self.text, ids, np.full(len(ids), -0.5, np.float32), policy_version=7)


@pytest.fixture(scope="module")
def builder(tiny_dir):
    return PromptBuilder.from_pretrained(tiny_dir)


def play(builder, text, max_steps, **server):
    cfg = EnvServerConfig(wire=WireConfig(endpoint="tcp://127.0.0.1:0"), slots=(SyntheticSlots(),), **server)
    task = TaskSpec(task_id="synthetic/click-button/0", backend="synthetic", name="click-button")

    async def main(endpoint):
        client = EnvClient(WireConfig(endpoint=endpoint))
        async with await client.acquire("synthetic") as env:
            traj = await run_episode(env, task, FixedText(builder, text), builder, max_steps=max_steps)
        await client.aclose()
        return traj

    with serving(cfg) as (_, wire):
        return asyncio.run(main(wire.endpoint))


def test_step_cap_truncates_and_keeps_every_observation(builder):
    traj = play(builder, "Thought: wait.\nAction: wait()", max_steps=3)
    assert traj.status == "truncated" and traj.reward == 0.0
    assert len(traj.steps) == 3 and len(traj.screenshots) == 4
    assert all(s.policy_version == 7 and s.valid and s.action == "wait()" for s in traj.steps)


def test_unparseable_text_is_an_invalid_step(builder):
    traj = play(builder, "I would like to click somewhere", max_steps=2, invalid_action="end")
    assert len(traj.steps) == 1 and not traj.steps[0].valid and traj.steps[0].action == ""
    assert traj.status != "success" and traj.reward == 0.0


def test_a_screen_text_prompt_holds_the_current_screens_elements(tmp_path):

    with_text = PromptBuilder.from_pretrained(make_tiny_hf_dir(tmp_path / "tiny"), PromptConfig(screen_text=True))
    traj = play(with_text, "Thought: wait.\nAction: wait()", max_steps=2)
    for step in traj.steps:
        text = with_text.tokenizer.decode(step.prompt_ids.tolist(), skip_special_tokens=False)
        assert text.count("Screen elements:") == 1 and text.count(' point="(') == 3  # click-button: 3 buttons
