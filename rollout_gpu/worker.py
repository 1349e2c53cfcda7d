"""`dart-jax rollout CONFIG`: one rollout worker, one vLLM engine, K episodes at once.

    while running:                                 # each of K episode loops
        rollout = await work.next()                # from the data manager's assignments
        async with await envs.acquire(backend) as env:
            traj = await run_episode(env, task, policy, ...)
        await submit(traj)                         # retried until the data manager acks

Beside them: a follower that takes the newest announced weight version (pulled beside
generation, made live at a pause; `Engine.update`; the announcements that queued up
during a pull are drained, so versions retired meanwhile are skipped), and a heartbeat
that keeps this worker's assignments out. A load that breaks the engine ends the worker
(its supervisor restarts it on a fresh engine, which catches up to the newest version). Each assignment is honoured exactly: its rollout
count, its step cap. A killed worker loses nothing acknowledged; its assignments return
to the pool when it restarts (a new session) or stays silent, its env leases likewise (a
new session's first acquire voids them; else they expire).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import time
import uuid
from pathlib import Path
from typing import Sequence

import msgspec

from dart_jax.agent.prompt import Prompt, PromptBuilder
from dart_jax.wire import AsyncClient, RemoteError, WireConfig, WireTimeout
from dart_jax.wire.messages import (EnvObservation, NoTask, SubmitTrajectory, TaskAssignment,
                                    TaskRequest, TaskSpec, Trajectory, TrajectoryAck, WeightAnnounce,
                                    WeightLatest, WorkerHeartbeat)
from dart_jax.wire.pubsub import Subscriber
from dart_jax.wire.config import WeightSyncConfig
from dart_jax.wire.env_client import EnvPool
from rollout_gpu.config import RolloutConfig
from rollout_gpu.engine import Engine, EngineBroken, SyncEvent
from rollout_gpu.episode import Sample, run_episode

log = logging.getLogger(__name__)
MAX_ROLLOUTS = 64  # per assignment: never trust a peer with more
RETRIES = 3  # plays of one rollout whose env server fails it


@dataclasses.dataclass(frozen=True)
class Rollout:
    task: TaskSpec
    max_steps: int
    assignment_id: str
    attempt: int = 0


class EnginePolicy:
    """The engine as the episode loop's policy."""

    def __init__(self, engine: Engine):
        self.engine = engine

    async def sample(self, prompt: Prompt, observation: EnvObservation, task: TaskSpec) -> Sample:
        return await self.engine.sample(prompt)


class Work:
    """Rollouts of the data manager's assignments, one at a time to K episode loops; one
    loop at a time asks for a new assignment when none is left."""

    def __init__(self, dm: AsyncClient, cfg: RolloutConfig, session: str, engine: Engine):
        self.dm, self.cfg, self.session, self.engine = dm, cfg, session, engine
        self.queue: list[Rollout] = []
        self._lock = asyncio.Lock()

    async def next(self) -> Rollout:
        async with self._lock:
            while not self.queue:
                try:
                    reply = await self.dm.request(TaskRequest(worker_id=self.cfg.worker_id, session=self.session,
                                                              policy_version=self.engine.version))
                except WireTimeout:  # the data manager is restarting: ask again
                    log.warning("no answer to a task request; asking again")
                    continue
                if isinstance(reply, NoTask):
                    await asyncio.sleep(reply.retry_after_s)
                elif isinstance(reply, TaskAssignment):
                    self.queue.extend(_rollouts(reply, self.cfg.max_steps_cap))
                else:
                    raise RuntimeError(f"the data manager answered a TaskRequest with {type(reply).__name__}")
            return self.queue.pop(0)

    def retry(self, rollout: Rollout) -> bool:
        """Play `rollout` again (its env server failed it); False once it has had its tries."""
        if rollout.attempt + 1 >= RETRIES:
            return False
        self.queue.insert(0, dataclasses.replace(rollout, attempt=rollout.attempt + 1))
        return True


def _rollouts(a: TaskAssignment, cap: int) -> list[Rollout]:
    n = min(a.num_rollouts, MAX_ROLLOUTS)
    if n != a.num_rollouts or a.max_steps > cap:
        log.warning("assignment %s asks for %d rollouts of %d steps; capped", a.assignment_id[:8],
                    a.num_rollouts, a.max_steps)
    return [Rollout(a.task, max(1, min(a.max_steps, cap)), a.assignment_id) for _ in range(n)]


class Worker:
    def __init__(self, cfg: RolloutConfig, engine: Engine, builder: PromptBuilder, dm_wire: WireConfig,
                 env_wires: Sequence[WireConfig], weights: WeightSyncConfig, metrics=None):
        self.cfg, self.engine, self.builder, self.weights = cfg, engine, builder, weights
        self.session = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.dm = AsyncClient(dm_wire)
        self.envs = EnvPool(env_wires, cfg.worker_id, self.session)
        self.work = Work(self.dm, cfg, self.session, engine)
        self.policy = EnginePolicy(engine)
        self.metrics = metrics
        self.syncs: list[SyncEvent] = []
        self.done = 0

    async def run(self, stop: asyncio.Event) -> None:
        """Play episodes until `stop` is set. A loop that fails unexpectedly fails the worker
        (loudly, so its supervisor restarts it) instead of leaving it half alive."""
        await self.catch_up()
        tasks = [asyncio.create_task(self.episodes(i)) for i in range(self.cfg.episodes)]
        tasks += [asyncio.create_task(self.follow_weights()), asyncio.create_task(self.heartbeat())]
        stopped = asyncio.create_task(stop.wait())
        try:
            done, _ = await asyncio.wait([*tasks, stopped], return_when=asyncio.FIRST_COMPLETED)
            for t in done - {stopped}:
                t.result()  # raises what ended it
        finally:
            stopped.cancel()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.envs.aclose()
            await self.dm.aclose()

    async def episodes(self, index: int) -> None:
        while True:
            rollout = await self.work.next()
            try:
                traj = await self.play(rollout)
            except (WireTimeout, RemoteError) as e:  # env server trouble (or no free slot): play it again
                again = self.work.retry(rollout)
                log.warning("episode loop %d: %s on %s: %s (%s)", index, type(e).__name__, rollout.task.task_id, e,
                            "retrying" if again else "dropped")
                await asyncio.sleep(self.cfg.submit_retry_s)
                continue
            await self.submit(traj)

    async def play(self, rollout: Rollout) -> Trajectory:
        first_sync = len(self.syncs)
        env = await self.envs.acquire(rollout.task.backend, self.cfg.acquire_wait_s)
        async with env:
            traj = await run_episode(env, rollout.task, self.policy, self.builder, max_steps=rollout.max_steps,
                                     worker_id=self.cfg.worker_id, temperature=self.cfg.sampling.temperature,
                                     assignment_id=rollout.assignment_id, env_slot=env.slot_name)
        loads = [(s.version, s.paused, s.resumed) for s in self.syncs[first_sync:] if s.ok]
        return msgspec.structs.replace(traj, weight_loads=loads) if loads else traj

    async def submit(self, traj: Trajectory) -> None:
        """Send until acknowledged (the data manager makes retries idempotent by traj_id)."""
        delay = self.cfg.submit_retry_s
        while True:
            try:
                ack = await self.dm.request(SubmitTrajectory(trajectory=traj))
                if isinstance(ack, TrajectoryAck):
                    break
                raise RuntimeError(f"the data manager answered a trajectory with {type(ack).__name__}")
            except WireTimeout:
                log.warning("no ack for %s; retrying in %.1f s", traj.traj_id[:8], delay)
            except RemoteError as e:
                if e.code not in ("unavailable", "internal", "timeout"):
                    log.error("the data manager refused %s: %s (dropped)", traj.traj_id[:8], e)
                    return
                log.warning("data manager: %s; retrying %s in %.1f s", e, traj.traj_id[:8], delay)
            await asyncio.sleep(delay)
            delay = min(2 * delay, 30.0)
        self.done += 1
        if self.metrics is not None:
            self.metrics.write(self.done, {"traj": traj.traj_id, "task": traj.task_id, "status": traj.status,
                                           "reward": traj.reward, "steps": len(traj.steps),
                                           "version": self.engine.version})

    # -- weights
    async def catch_up(self) -> None:
        """Before the first episode: take the newest published version, if there is one."""
        with contextlib.suppress(WireTimeout, RemoteError):  # none published yet, or no trainer
            async_client = AsyncClient(dataclasses.replace(self.weights.serve, timeout_s=5.0))
            try:
                ann = await async_client.request(WeightLatest())
            finally:
                await async_client.aclose()
            if isinstance(ann, WeightAnnounce):
                await self.take(ann)

    async def follow_weights(self) -> None:
        sub = Subscriber(self.weights.announce)
        try:
            while True:
                ann = await newest(sub, await sub.receive(timeout_s=1.0))
                if ann is not None and ann.version > self.engine.version:
                    await self.take(ann)
        finally:
            sub.close()

    async def take(self, ann: WeightAnnounce) -> None:
        try:
            event = await self.engine.update(ann, self.weights)
        except EngineBroken as e:
            self._record(SyncEvent(ann.version, time.time(), 0.0, 0.0, ok=False, error=f"engine broken: {e}"))
            raise
        self._record(event)
        if event.ok:
            log.info("now serving version %d (pull %.2f s, paused %.3f s)", event.version,
                     event.paused - event.started, event.resumed - event.paused)
        else:
            log.warning("kept version %d; version %d failed: %s", self.engine.version, ann.version, event.error)

    def _record(self, event: SyncEvent) -> None:
        self.syncs.append(event)
        if self.metrics is not None:
            self.metrics.write(self.done, {"sync_version": event.version, "sync_ok": event.ok,
                                           "sync_started": event.started, "sync_pulled": event.pulled,
                                           "sync_paused": event.paused, "sync_resumed": event.resumed,
                                           "sync_error": event.error})

    async def heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.heartbeat_s)
            with contextlib.suppress(WireTimeout, RemoteError):
                await self.dm.request(WorkerHeartbeat(worker_id=self.cfg.worker_id, session=self.session,
                                                      policy_version=self.engine.version),
                                      timeout_s=self.cfg.heartbeat_s)


async def newest(sub: Subscriber, first) -> WeightAnnounce | None:
    """The newest of `first` and every announcement already queued behind it."""
    best = first if isinstance(first, WeightAnnounce) else None
    while (msg := await sub.receive(timeout_s=0)) is not None:
        if isinstance(msg, WeightAnnounce) and (best is None or msg.version > best.version):
            best = msg
    return best


async def serve(cfg: RolloutConfig, hf_dir: Path, dm_wire: WireConfig, env_wires: Sequence[WireConfig],
                weights: WeightSyncConfig, metrics=None, stop: asyncio.Event | None = None) -> None:
    """Start the engine and run the worker until `stop` (default: SIGTERM or SIGINT)."""
    if stop is None:
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    engine = await Engine.start(hf_dir, cfg.engine, cfg.sampling)
    try:
        worker = Worker(cfg, engine, PromptBuilder.from_pretrained(hf_dir, cfg.prompt), dm_wire, env_wires, weights, metrics)
        log.info("rollout worker %s (session %s): %d episodes at once", cfg.worker_id, worker.session, cfg.episodes)
        await worker.run(stop)
    finally:
        engine.shutdown()
