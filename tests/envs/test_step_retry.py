"""Step retries: a retry that arrives while the first call still runs waits for it and gets
its reply (the action runs once); client timeouts must exceed the server's deadlines."""

import asyncio
import threading
import time

import pytest
import zmq

from dart_jax.wire import AsyncClient, RemoteError, WireConfig, codec
from dart_jax.wire.messages import EnvStep
from envs.config import SyntheticSlots

from tests.envs.conftest import client, run, spec


class DelayingProxy:
    """A hop between one client and the env server holding the first EnvStep back for
    `delay_s`: a congested link, so the client's step times out for real and it retries."""

    def __init__(self, server_endpoint: str, delay_s: float):
        self.ctx = zmq.Context()
        self.front, self.back = self.ctx.socket(zmq.ROUTER), self.ctx.socket(zmq.DEALER)
        self.front.bind("tcp://127.0.0.1:0")
        self.back.connect(server_endpoint)
        self.endpoint = self.front.getsockopt_string(zmq.LAST_ENDPOINT)
        self.delay_s, self.steps_seen, self.peer = delay_s, 0, None
        self.held: list[tuple[float, list]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.front, zmq.POLLIN)
        poller.register(self.back, zmq.POLLIN)
        while not self._stop.is_set():
            events = dict(poller.poll(10))
            if self.front in events:
                self.peer, *payload = self.front.recv_multipart()
                self._forward(payload)
            if self.back in events:
                self.front.send_multipart([self.peer, *self.back.recv_multipart()])
            while self.held and self.held[0][0] <= time.monotonic():
                self.back.send_multipart(self.held.pop(0)[1])

    def _forward(self, payload: list) -> None:
        if isinstance(codec.decode(payload, 1 << 26)[1], EnvStep):
            self.steps_seen += 1
            if self.steps_seen == 1:
                self.held.append((time.monotonic() + self.delay_s, payload))
                return
        self.back.send_multipart(payload)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.front.close(0)
        self.back.close(0)
        self.ctx.term()


def slow_steps(envs, seconds: float) -> list:
    """Make slot 0's backend take `seconds` per step; returns the list of steps it ran."""
    env = envs.slots[0].env
    ran, step = [], env.step

    def slow(action):
        time.sleep(seconds)
        ran.append(action)
        return step(action)

    env.step = slow
    return ran


def test_a_real_timeout_and_retry_runs_the_action_once(env_server):
    # server deadline 2 s < client timeout 2.5 s (checked on acquire); the first step is held
    # 2 s on the link and runs 1 s on the backend, so the client times out at 2.5 s and its
    # retry reaches the server while the first call runs: it waits and gets that reply
    envs, endpoint = env_server(SyntheticSlots(count=1), step_timeout_s=2.0)
    proxy = DelayingProxy(endpoint, delay_s=2.0)

    async def main():
        c = client(proxy.endpoint, step_timeout_s=2.5)
        try:
            env = await c.acquire()
            await env.reset(spec("synthetic", "click-button", 1))
            ran = slow_steps(envs, 1.0)
            start = time.monotonic()
            reply = await env.step("Action: wait()")
            took = time.monotonic() - start
            return reply, took, ran, (await c.stats()).slots[0]
        finally:
            await c.aclose()

    try:
        reply, took, ran, slot = run(main())
    finally:
        proxy.close()
    assert proxy.steps_seen == 2 and 2.5 <= took < 5.0  # timed out once, retried once
    assert (reply.status, reply.step, len(ran), slot.steps, slot.env_errors) == ("ok", 1, 1, 1, 0)


def test_a_concurrent_retry_waits_and_a_third_call_is_refused(env_server):
    envs, endpoint = env_server(SyntheticSlots(count=1))

    async def main():
        c, wire = client(endpoint), AsyncClient(WireConfig(endpoint=endpoint, timeout_s=30))
        try:
            env = await c.acquire()
            await env.reset(spec("synthetic", "click-button", 1))
            ran = slow_steps(envs, 1.0)
            step = EnvStep(lease_id=env.lease_id, step=0, action="Action: wait()")
            return await asyncio.gather(*(wire.request(step) for _ in range(3)), return_exceptions=True), ran
        finally:
            await wire.aclose()
            await c.aclose()

    replies, ran = run(main())
    refusals = [r for r in replies if isinstance(r, RemoteError)]
    answers = [r for r in replies if not isinstance(r, Exception)]
    # one call runs, one retry waits for it (one waiter per slot), the third is refused
    assert [r.code for r in refusals] == ["conflict"] and len(answers) == 2
    assert answers[0] == answers[1] and answers[0].status == "ok" and len(ran) == 1


@pytest.mark.parametrize("call", ["reset", "step", "evaluate"])
def test_client_timeouts_must_exceed_the_servers(env_server, call):
    _, endpoint = env_server(SyntheticSlots(count=1), **{f"{call}_timeout_s": 5.0})

    async def main():
        c = client(endpoint, **{f"{call}_timeout_s": 5.0})
        try:
            with pytest.raises(ValueError, match=f"{call} timeout 5 s must exceed the env server's {call}_timeout_s"):
                await c.acquire()
            assert not c.sessions  # nothing was leased
        finally:
            await c.aclose()

    run(main())
