import asyncio
import contextlib
import types

import numpy as np
import pytest

from dart_jax.agent.prompt import PromptBuilder
from dart_jax.run import demos
from dart_jax.wire import RemoteError, WireConfig, env_client
from dart_jax.wire.messages import Error, TaskSpec
from envs.config import EnvServerConfig, SyntheticSlots
from envs.server import serving


@pytest.fixture(scope="module")
def builder(tiny_dir):
    return PromptBuilder.from_pretrained(tiny_dir)


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


class _Client:
    """An env client whose `slow` backend refuses `busy` leases before it grants one (a
    browser slot held by an episode stuck until the server's deadline); it records the order
    in which tasks were played."""

    def __init__(self, busy: int):
        self.busy, self.played = busy, []

    async def acquire(self, backend: str, wait_s: float = 60.0):
        if backend == "slow" and self.busy:
            self.busy -= 1
            raise RemoteError(Error(code="unavailable", message="all 1 slots are leased"))
        return contextlib.nullcontext(backend)

    async def aclose(self) -> None:
        pass


def _play_demos(monkeypatch, builder, busy: int, **kw) -> list[str]:
    client = _Client(busy)

    async def episode(env, task, *args, **kwargs):
        client.played.append(task.task_id)
        return types.SimpleNamespace(status="success", reward=1.0, steps=[])

    monkeypatch.setattr(env_client, "EnvClient", lambda *a, **k: client)
    monkeypatch.setattr(demos, "run_episode", episode)
    tasks = [TaskSpec(task_id=f"{b}/t/{s}", backend=b, name="t", seed=s) for b, s in
             [("slow", 0), ("fast", 0), ("fast", 1)]]
    asyncio.run(demos.collect(WireConfig(endpoint="tcp://127.0.0.1:1"), tasks, builder, max_steps=3,
                              concurrency=1, **kw))
    return client.played


def test_a_busy_backend_holds_up_only_its_own_tasks(monkeypatch, builder):
    assert _play_demos(monkeypatch, builder, busy=2) == ["fast/t/0", "fast/t/1", "slow/t/0"]


def test_a_backend_busy_past_the_bound_fails_the_demos(monkeypatch, builder):
    with pytest.raises(RemoteError, match="unavailable"):
        _play_demos(monkeypatch, builder, busy=10**6, slot_wait_s=0.3)
