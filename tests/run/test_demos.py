import asyncio

import numpy as np
import pytest

from dart_jax.agent.prompt import PromptBuilder
from dart_jax.run import demos
from dart_jax.models.tiny import make_tiny_hf_dir
from dart_jax.wire import WireConfig
from dart_jax.wire.messages import TaskSpec
from envs.config import EnvServerConfig, SyntheticSlots
from envs.server import serving


@pytest.fixture(scope="module")
def builder(tmp_path_factory):
    return PromptBuilder.from_pretrained(make_tiny_hf_dir(tmp_path_factory.mktemp("tiny")))


def test_oracle_demos_through_env_server_record_what_the_policy_saw(builder):
    cfg = EnvServerConfig(wire=WireConfig(endpoint="tcp://127.0.0.1:0"), slots=(SyntheticSlots(count=2),))
    names = ["click-button", "enter-text", "check-boxes", "form", "select-item"]
    tasks = [TaskSpec(task_id=f"synthetic/{n}/{s}", backend="synthetic", name=n, seed=s)
             for n in names for s in range(2)]
    with serving(cfg) as (_, wire):
        trajs = asyncio.run(demos.collect(WireConfig(endpoint=wire.endpoint), tasks, builder,
                                          max_steps=12, concurrency=2))
    assert sorted(t.task_id for t in trajs) == sorted(t.task_id for t in tasks)
    assert all(t.status == "success" and t.reward == 1.0 and t.source == "demo" for t in trajs)
    form = next(t for t in trajs if "form" in t.task_id)
    assert len(form.steps) >= 3 and len(form.screenshots) == len(form.steps) + 1
    for i, step in enumerate(form.steps):
        # The prompt holds the last <= 5 screenshots up to this step, each expanded to its pads.
        assert step.image_refs == list(range(max(0, i + 1 - 5), i + 1))
        assert (step.prompt_ids == builder.image_pad_id).sum() > 0
        np.testing.assert_array_equal(step.response_ids, builder.response_ids(step.response_text))
        assert step.valid and step.action and step.logprobs.shape == step.response_ids.shape
