"""asyncio client of the env server, for rollout workers running many episodes at once, and
`EnvPool`, the slots of several env servers.

    client = EnvClient(WireConfig(endpoint="tcp://127.0.0.1:5555"), client_id="worker-0")
    async with await client.acquire("miniwob") as env:      # one slot, heartbeated
        reply = await env.reset(task_spec)
        while not reply.done:
            reply = await env.step(model_text)
        reward = await env.evaluate()
    await client.aclose()

All sessions share one DEALER socket; a background task renews every held lease, so a
slot is kept while the policy thinks and reclaimed by the server if this process dies.
A step that times out is retried once with the same step index (the server answers a
retry from its cache, or waits for the first call when it still runs, so an action is never
applied twice). Each client timeout must exceed the server's deadline for that call, so
that the server, which restarts a stuck backend, gives up first: the first acquire checks
this against the server's Pong and raises ValueError when it does not hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
from typing import Sequence

from dart_jax.wire import AsyncClient, RemoteError, WireConfig, WireTimeout
from dart_jax.wire.messages import (EnvAcquire, EnvEvaluate, EnvHeartbeat, EnvLease, EnvListTasks, EnvRelease,
                                    EnvReply, EnvReset, EnvReward, EnvStats, EnvStatsRequest, EnvStep, Ping,
                                    TaskSpec)

log = logging.getLogger(__name__)


class EnvClient:
    def __init__(self, cfg: WireConfig, client_id: str = "", *, session: str = "", reset_timeout_s: float = 150.0,
                 step_timeout_s: float = 90.0, evaluate_timeout_s: float = 330.0):
        """Timeouts must exceed the server's own (EnvServerConfig); checked on the first acquire.
        `session` names this life of `client_id`: the server voids the leases of its other lives."""
        self.wire = AsyncClient(cfg)
        self.client_id = client_id or f"{os.uname().nodename}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.session = session
        self.timeouts = {"reset": reset_timeout_s, "step": step_timeout_s, "evaluate": evaluate_timeout_s}
        self.sessions: dict[str, EnvSession] = {}
        self._heartbeat: asyncio.Task | None = None
        self._checked = False

    async def acquire(self, backend: str = "", wait_s: float = 60.0) -> "EnvSession":
        """Lease a slot of `backend` ("" = any), waiting up to `wait_s` for one to free up."""
        if not self._checked:
            await self.check_timeouts()
        deadline, delay = time.monotonic() + wait_s, 0.05
        while True:
            try:
                lease = await self.wire.request(EnvAcquire(client_id=self.client_id, backend=backend, session=self.session))
                break
            except RemoteError as e:
                if e.code != "unavailable" or time.monotonic() + delay > deadline:
                    raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.25)
        session = self.sessions[lease.lease_id] = EnvSession(self, lease)
        if self._heartbeat is None:
            self._heartbeat = asyncio.get_running_loop().create_task(self._beat(lease.lease_s / 3))
        return session

    async def check_timeouts(self) -> None:
        """Raise ValueError unless each timeout here exceeds the server's deadline for that
        call: else this side would retry while the server still works on the first try."""
        info = (await self.wire.request(Ping())).info
        for call, mine in self.timeouts.items():
            theirs = info.get(f"{call}_timeout_s")
            if not isinstance(theirs, (int, float)) or mine <= theirs:
                raise ValueError(f"env client {call} timeout {mine:g} s must exceed the env server's "
                                 f"{call}_timeout_s ({theirs} at {self.wire.cfg.endpoint})")
        self._checked = True

    async def stats(self, reset: bool = False) -> EnvStats:
        return await self.wire.request(EnvStatsRequest(reset=reset))

    async def tasks(self, backend: str) -> list[str]:
        return (await self.wire.request(EnvListTasks(backend=backend))).names

    async def _beat(self, period_s: float) -> None:
        while True:
            await asyncio.sleep(period_s)
            if not self.sessions:
                continue
            asked = list(self.sessions)  # a lease taken while the ack is on its way is not in it
            with contextlib.suppress(WireTimeout, RemoteError):
                ack = await self.wire.request(EnvHeartbeat(lease_ids=asked), timeout_s=period_s)
                for lease_id in set(asked) - set(ack.alive):
                    if (session := self.sessions.pop(lease_id, None)) is not None:  # not released meanwhile
                        log.warning("lease %s was reclaimed by the env server", lease_id[:12])
                        session.lost = True

    async def aclose(self) -> None:
        for session in list(self.sessions.values()):
            with contextlib.suppress(WireTimeout, RemoteError):
                await session.release()
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        await self.wire.aclose()


class EnvSession:
    """One leased slot: reset / step / evaluate episodes on it, then release it."""

    def __init__(self, client: EnvClient, lease: EnvLease):
        self.client, self.lease_id, self.slot, self.backend = client, lease.lease_id, lease.slot, lease.backend
        self.steps = 0
        self.lost = False

    @property
    def slot_name(self) -> str:
        """The slot across env servers: "ENDPOINT#SLOT"."""
        return f"{self.client.wire.cfg.endpoint}#{self.slot}"

    async def reset(self, task: TaskSpec) -> EnvReply:
        reply = await self._request(EnvReset(lease_id=self.lease_id, task=task), "reset")
        self.steps = 0
        return reply

    async def step(self, action_text: str) -> EnvReply:
        msg = EnvStep(lease_id=self.lease_id, step=self.steps, action=action_text)
        try:
            reply = await self._request(msg, "step")
        except WireTimeout:
            reply = await self._request(msg, "step")
        self.steps += 1
        return reply

    async def evaluate(self) -> EnvReward:
        return await self._request(EnvEvaluate(lease_id=self.lease_id), "evaluate")

    async def release(self) -> None:
        self.client.sessions.pop(self.lease_id, None)
        if not self.lost:
            await self.client.wire.request(EnvRelease(lease_id=self.lease_id))

    async def _request(self, msg, kind: str):
        return await self.client.wire.request(msg, timeout_s=self.client.timeouts[kind])

    async def __aenter__(self) -> "EnvSession":
        return self

    async def __aexit__(self, *exc) -> None:
        with contextlib.suppress(WireTimeout, RemoteError):
            await self.release()


class EnvPool:
    """Env slots from several env servers: a lease from whichever has a free slot of the backend."""

    def __init__(self, wires: Sequence[WireConfig], client_id: str, session: str = ""):
        self.clients = [EnvClient(w, client_id=client_id, session=session) for w in wires]
        self._next = 0

    async def acquire(self, backend: str, wait_s: float) -> EnvSession:
        """A leased session, asking the servers in turn; once `wait_s` is past (0: one round),
        the last server's refusal (RemoteError: `unavailable`, or no such backend there)."""
        deadline, delay = time.monotonic() + wait_s, 0.05
        while True:
            for _ in range(len(self.clients)):
                client = self.clients[self._next % len(self.clients)]
                self._next += 1
                try:
                    return await client.acquire(backend, wait_s=0.0)
                except RemoteError as e:
                    refusal = e
            if time.monotonic() > deadline:
                raise refusal
            await asyncio.sleep(delay)
            delay = min(2 * delay, 0.5)

    async def aclose(self) -> None:
        for client in self.clients:
            await client.aclose()
