"""The Env contract, run over every backend (OSWorld against a fake in-VM server)."""

import io

import pytest
from PIL import Image

from envs.backends import make_env
from envs.config import MiniWoBSlots, OSWorldSlots, SyntheticSlots
from envs.types import ACTION_KINDS, Action, Env, Observation, StepResult, Task, TaskError

from tests.envs.conftest import INFEASIBLE_TASK


def _case(backend, fake_vm):
    if backend == "synthetic":
        return (make_env(SyntheticSlots()), Task("synthetic/form/1", "synthetic", "form", 1),
                Task("synthetic/nope/1", "synthetic", "nope"))
    if backend == "miniwob":
        return (make_env(MiniWoBSlots()), Task("miniwob/click-checkboxes/1", "miniwob", "click-checkboxes", 1),
                Task("miniwob/nope/1", "miniwob", "nope"))
    spec = OSWorldSlots(provider="remote", remote_urls=(fake_vm.url,), settle_s=0.0)
    return (make_env(spec), Task("osworld/x", "osworld", "x", config={"example": INFEASIBLE_TASK}),
            Task("osworld/y", "osworld", "y", config={}))


def _check(obs: Observation) -> None:
    assert isinstance(obs, Observation) and obs.instruction
    assert Image.open(io.BytesIO(obs.screenshot)).size == (obs.width, obs.height)


def _every_action(w: int, h: int) -> list[Action]:
    p, q = (w * 0.3, h * 0.6), (w * 0.5, h * 0.7)
    actions = [Action(kind="click", point=p), Action(kind="left_double", point=p),
               Action(kind="right_single", point=q), Action(kind="drag", point=p, end_point=q),
               Action(kind="hotkey", keys=("ctrl", "a")), Action(kind="type", content="hi\n"),
               Action(kind="scroll", point=q, direction="down"), Action(kind="scroll", direction="left"),
               Action(kind="wait")]
    assert {a.kind for a in actions} == set(ACTION_KINDS) - {"finished", "call_user"}
    return actions


@pytest.mark.parametrize("backend", ["synthetic", pytest.param("miniwob", marks=pytest.mark.browser), "osworld"])
def test_env_contract(backend, fake_vm):
    env, task, unknown = _case(backend, fake_vm)
    try:
        assert isinstance(env, Env)
        obs = env.reset(task)
        _check(obs)
        for action in _every_action(obs.width, obs.height):
            result = env.step(action)
            assert isinstance(result, StepResult)
            _check(result.observation)
            assert (result.observation.width, result.observation.height) == (obs.width, obs.height)
            assert 0.0 <= env.evaluate() <= 1.0
            if result.done:
                env.reset(task)
        for kind in ("finished", "call_user"):
            env.reset(task)
            assert env.step(Action(kind=kind)).done
            assert 0.0 <= env.evaluate() <= 1.0
        with pytest.raises(TaskError):
            env.reset(unknown)
        _check(env.reset(task))  # usable after a refused task
    finally:
        env.close()
    if backend == "osworld":
        assert any("pyautogui.click" in cmd[-1] for cmd in fake_vm.commands)
