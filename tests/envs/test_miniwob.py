"""MiniWoB++ through the full server/client path and the UI-TARS text format."""

import asyncio
import os
import signal

import pytest

from envs.config import MiniWoBSlots
from envs.miniwob_env import task_names

from tests.envs.conftest import client, oracle_episode, run, spec

ORACLE_TASKS = ("click-button", "click-test", "click-test-2", "enter-text", "focus-text", "click-checkboxes")


def test_every_task_is_listed():
    names = task_names()
    assert len(names) == 128 and set(ORACLE_TASKS) <= set(names)


@pytest.mark.browser
def test_dom_oracle_solves_six_tasks_over_the_wire(env_server):
    _, endpoint = env_server(MiniWoBSlots(count=2))

    async def main():
        c = client(endpoint)
        sessions = [await c.acquire("miniwob") for _ in range(2)]

        async def worker(session, jobs):
            return [(name, await oracle_episode(session, spec("miniwob", name, seed))) for name, seed in jobs]

        jobs = [(name, seed) for name in ORACLE_TASKS for seed in range(20)]
        results = await asyncio.gather(*(worker(s, jobs[i::2]) for i, s in enumerate(sessions)))
        await c.aclose()
        return [r for rs in results for r in rs]

    results = run(main())
    rates = {name: sum(r.reward == 1.0 for n, r in results if n == name) / 20 for name in ORACLE_TASKS}
    print("oracle success per task:", rates)
    assert all(rate >= 0.9 for rate in rates.values()), rates
    assert not any(r.status == "env_error" for _, r in results)


@pytest.mark.browser
def test_time_limit_is_lifted_and_reward_is_raw(env_server):
    """click-test's page limit is 10 s; a step after 11 s still succeeds with reward 1."""
    envs, endpoint = env_server(MiniWoBSlots(count=1))

    async def main():
        c = client(endpoint)
        env = await c.acquire("miniwob")
        reply = await env.reset(spec("miniwob", "click-test", 0))
        await asyncio.sleep(11)
        button = next(line for line in reply.observation.dom_text.splitlines() if " button " in line)
        x, y, w, h = (float(v) for v in button.split("(")[1].split(")")[0].split(","))
        mx, my = round((x + w / 2) * 252 / 160), round((y + h / 2) * 336 / 210)
        reply = await env.step(f"Action: click(start_box='({mx},{my})')")
        reward = await env.evaluate()
        await c.aclose()
        return reply, reward

    reply, reward = run(main())
    assert reply.done and reward.reward == 1.0


@pytest.mark.browser
def test_chromium_killed_mid_episode(env_server):
    envs, endpoint = env_server(MiniWoBSlots(count=1))

    async def main():
        c = client(endpoint)
        env = await c.acquire("miniwob")
        reply = await env.reset(spec("miniwob", "click-checkboxes", 1))
        assert reply.status == "ok"
        browser = envs.slots[0].env
        for pid in browser.browser_pids():
            os.kill(pid, signal.SIGKILL)
        reply = await env.step("Action: click(start_box='(20,100)')")
        assert (reply.status, reply.done) == ("env_error", True)
        assert (await env.evaluate()).status == "env_error"
        # the same slot serves the next episode on a fresh browser
        reward = await oracle_episode(env, spec("miniwob", "click-checkboxes", 2))
        stats = await c.stats()
        await c.aclose()
        return reward, stats.slots[0], browser

    reward, slot, old = run(main())
    assert reward.reward == 1.0 and reward.status == "success"
    assert (slot.env_errors, slot.restarts) == (1, 1) and envs.slots[0].env is not old
