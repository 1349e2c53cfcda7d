"""The env server through its asyncio client: episodes, leases, faults, retries, policies."""

import asyncio
import os
import signal
import subprocess
import sys
import time

import pytest

from dart_jax.wire import RemoteError
from dart_jax.wire.messages import EnvHeartbeat
from envs.config import SyntheticSlots
from envs.synthetic import TASKS

from tests.envs.conftest import client, oracle_episode, run, spec

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_oracle_solves_synthetic_tasks_concurrently(env_server):
    _, endpoint = env_server(SyntheticSlots(count=4, difficulty=2))

    async def main():
        c = client(endpoint)
        sessions = [await c.acquire("synthetic") for _ in range(4)]

        async def worker(session, names):
            return [await oracle_episode(session, spec("synthetic", n, s)) for n, s in names]

        jobs = [[(name, seed) for name in TASKS for seed in range(i, 12, 4)] for i in range(4)]
        rewards = await asyncio.gather(*(worker(s, j) for s, j in zip(sessions, jobs)))
        stats = await c.stats()
        await c.aclose()
        return [r for rs in rewards for r in rs], stats

    rewards, stats = run(main())
    assert len(rewards) == 12 * len(TASKS) and all(r.reward == 1.0 and r.status == "success" for r in rewards)
    assert sum(s.episodes for s in stats.slots) == 12 * len(TASKS) and all(s.utilization > 0 for s in stats.slots)
    assert sorted(run(_tasks(endpoint))) == sorted(TASKS)


async def _tasks(endpoint):
    c = client(endpoint)
    try:
        return await c.tasks("synthetic")
    finally:
        await c.aclose()


def test_leases_are_exclusive_and_released(env_server):
    _, endpoint = env_server(SyntheticSlots(count=2))

    async def main():
        c = client(endpoint)
        a, b = await c.acquire(), await c.acquire()
        assert a.slot != b.slot
        with pytest.raises(RemoteError, match="unavailable"):
            await c.acquire(wait_s=0.2)
        with pytest.raises(RemoteError, match="bad_request"):
            await c.acquire("miniwob")
        await a.release()
        with pytest.raises(RemoteError, match="not_found"):
            await a.reset(spec("synthetic", "form"))
        again = await c.acquire(wait_s=1)
        assert again.slot == a.slot
        await c.aclose()

    run(main())


def test_step_retry_is_idempotent_and_order_is_checked(env_server):
    envs, endpoint = env_server(SyntheticSlots(count=1))

    async def main():
        c = client(endpoint)
        env = await c.acquire()
        await env.reset(spec("synthetic", "enter-text", 3))
        box = "Action: click(start_box='(1,1)')"
        first = await env.step(box)
        # the same step index again (a retry after a lost reply): the cached answer
        env.steps = 0
        assert await env.step(box) == first
        env.steps = 5
        with pytest.raises(RemoteError, match="conflict"):
            await env.step(box)
        await c.aclose()
        return envs.slots[0].steps

    assert run(main()) == 1  # applied once


@pytest.mark.parametrize("policy", ["penalty", "end"])
def test_invalid_actions(env_server, policy):
    _, endpoint = env_server(SyntheticSlots(count=1), invalid_action=policy, invalid_penalty=0.25)

    async def main():
        c = client(endpoint)
        env = await c.acquire()
        task = spec("synthetic", "click-button", 4)
        first = await env.reset(task)
        bad = await env.step("Thought: hmm\nAction: click(start_box='(oops)')")
        assert bad.status == "invalid" and "bad point" in bad.message and bad.action == ""
        if policy == "end":
            assert bad.done
            reward = await env.evaluate()
            assert (reward.reward, reward.status, reward.invalid_steps) == (0.0, "parse_error", 1)
        else:
            assert not bad.done and bad.observation == first.observation
            reward = await oracle_episode_from(env, task, first)
            assert reward.reward == 0.75 and reward.invalid_steps == 1
        await c.aclose()

    run(main())


def test_several_actions_never_reach_the_backend(env_server):
    envs, endpoint = env_server(SyntheticSlots(count=1))

    async def main():
        c = client(endpoint)
        env = await c.acquire()
        first = await env.reset(spec("synthetic", "enter-text", 3))
        several = await env.step("Thought: t\nAction: type(content='hi')\n\nhotkey(key='enter')")
        quoted = await env.step("Thought: t\nAction: type(content='Action: hi\\n\\nwait()')")
        await c.aclose()
        return first, several, quoted

    first, several, quoted = run(main())
    assert (several.status, several.action, several.observation) == ("invalid", "", first.observation)
    assert several.message == "2 actions in one response (type, hotkey); one action per step"
    assert (quoted.status, quoted.action) == ("ok", "type(content='Action: hi\\n\\nwait()')")
    assert envs.slots[0].steps == 1  # only the one-action response ran


async def oracle_episode_from(env, task, reply):
    from envs import oracle
    from tests.envs.conftest import observation
    while not reply.done:
        reply = await env.step(oracle.act("synthetic", task.name, observation(reply)))
    return await env.evaluate()


def test_backend_failure_and_timeout_end_the_episode_and_the_slot_recovers(env_server):
    envs, endpoint = env_server(SyntheticSlots(count=1), step_timeout_s=0.5)

    def crash(action):
        raise RuntimeError("browser went away")

    def hang(action):
        time.sleep(3)

    async def main():
        c = client(endpoint)
        env = await c.acquire()
        for fault in (crash, hang):
            await env.reset(spec("synthetic", "click-button", 1))
            envs.slots[0].env.step = fault
            reply = await env.step("Action: wait()")
            assert (reply.status, reply.done) == ("env_error", True)
            assert (await env.evaluate()).status == "env_error"
            reward = await oracle_episode(env, spec("synthetic", "click-button", 2))
            assert reward.reward == 1.0
        stats = await c.stats()
        await c.aclose()
        return stats.slots[0]

    slot = run(main())
    assert (slot.env_errors, slot.restarts) == (2, 2)


CLIENT_SCRIPT = """
import asyncio, sys
from tests.envs.conftest import client, spec
async def main():
    c = client(sys.argv[1])
    env = await c.acquire()
    await env.reset(spec("synthetic", "form", 1))
    print("leased", flush=True)
    await asyncio.sleep(60)
asyncio.run(main())
"""


def test_a_killed_client_loses_its_slot(env_server):
    _, endpoint = env_server(SyntheticSlots(count=1), lease_s=1.0)
    proc = subprocess.Popen([sys.executable, "-c", CLIENT_SCRIPT, endpoint], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "leased"

        async def main():
            c = client(endpoint)
            with pytest.raises(RemoteError, match="unavailable"):
                await c.acquire(wait_s=1.5)  # the live client heartbeats: its slot stays taken
            os.kill(proc.pid, signal.SIGKILL)
            start = time.monotonic()
            env = await c.acquire(wait_s=10)
            waited = time.monotonic() - start
            reward = await oracle_episode(env, spec("synthetic", "form", 2))
            await c.aclose()
            return waited, reward

        waited, reward = run(main())
        assert waited < 5 and reward.reward == 1.0
    finally:
        proc.kill()
        proc.wait()


def test_a_clients_new_session_voids_its_earlier_sessions_leases_and_no_one_elses(env_server):
    """A restarted worker (same client id, new session) gets the slots its dead life held at
    once, not after `lease_s`; another client's lease and a session-less one are kept."""
    _, endpoint = env_server(SyntheticSlots(count=3), lease_s=60.0)

    async def main():
        old = client(endpoint, client_id="rollout-0", session="1-a")
        other, anonymous = client(endpoint, client_id="rollout-1", session="2-b"), client(endpoint, client_id="rollout-0")
        dead, kept, plain = await old.acquire(), await other.acquire(), await anonymous.acquire()
        old._heartbeat.cancel()  # its process died: no heartbeat, no release
        new = client(endpoint, client_id="rollout-0", session="3-c")
        start = time.monotonic()
        env = await new.acquire(wait_s=10)
        waited = time.monotonic() - start
        reward = await oracle_episode(env, spec("synthetic", "form", 2))
        with pytest.raises(RemoteError, match="not_found"):
            await dead.reset(spec("synthetic", "form", 1))
        with pytest.raises(RemoteError, match="unavailable"):  # the other two leases still stand
            await new.acquire(wait_s=0.0)
        for c in (old, new, other, anonymous):  # the dead life's release finds nothing to free
            await c.aclose()
        return waited, reward, kept.lost, plain.lost

    waited, reward, *lost = run(main())
    assert waited < 5 and reward.reward == 1.0 and lost == [False, False]


def test_a_lease_taken_while_a_heartbeat_is_in_flight_is_not_taken_for_lost(env_server):
    """The ack names only the leases the heartbeat asked about. An episode that ends and a next
    one that leases the slot before the ack is read must keep its lease: marked lost, its
    release would be skipped and the slot held until the server reaps it (which stalled the
    demos of `make run`: one MiniWoB slot, six sessions)."""
    _, endpoint = env_server(SyntheticSlots(count=1), lease_s=0.6)

    async def main():
        c, other = client(endpoint), client(endpoint)
        first, nxt = await c.acquire(), []
        heartbeat = c.wire.request

        async def request(msg, timeout_s=None):
            reply = await heartbeat(msg, timeout_s)
            if isinstance(msg, EnvHeartbeat) and not nxt:
                await first.release()
                nxt.append(await c.acquire(wait_s=0.0))
            return reply

        c.wire.request = request
        while not nxt:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)  # the ack read, and one more heartbeat
        lost, kept = nxt[0].lost, nxt[0].lease_id in c.sessions
        await nxt[0].release()
        freed = await other.acquire(wait_s=0.0)  # the release reached the server
        await freed.release()
        await c.aclose()
        await other.aclose()
        return lost, kept

    assert run(main()) == (False, True)


def test_slot_busy_counts_only_the_window_and_calls_in_progress():
    """A call that began before a stats reset counts only from the reset on, and a call in
    progress counts up to now: a slot is never busier than its window."""
    import threading

    from envs.server import Slot

    slot = Slot(0, SyntheticSlots(), 0)
    call = threading.Thread(target=slot.call, args=(lambda env: time.sleep(0.6), 5.0))
    call.start()
    time.sleep(0.3)
    slot.reset_window(time.monotonic())
    time.sleep(0.1)
    during = slot.stats(time.monotonic())
    assert 0.05 < during.busy_s <= during.wall_s
    call.join()
    time.sleep(0.1)
    after = slot.stats(time.monotonic())
    assert after.busy_s < after.wall_s and after.busy_s < 0.45, (after.busy_s, after.wall_s)
    assert after.busy_s > 0.2


def test_observations_carry_each_elements_click_point(env_server):
    from envs import actions, dom

    _, endpoint = env_server(SyntheticSlots(count=1))

    async def main():
        c = client(endpoint)
        session = await c.acquire("synthetic")
        reply = await session.reset(spec("synthetic", "enter-text", 3))
        await c.aclose()
        return reply.observation

    obs = run(main())
    elements = dom.parse(obs.dom_text)
    assert [e.role for e in elements] == ["textbox", "button"]
    for e in elements:
        assert e.attrs["point"] == "({},{})".format(*actions.to_model(e.center, (obs.width, obs.height)))
