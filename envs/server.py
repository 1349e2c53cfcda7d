"""The env server: N environment slots of any backends behind one ZeroMQ ROUTER.

    run(cfg, run_dir)            # `dart-jax env-server`: serves until SIGTERM/SIGINT

Each slot owns one environment and one thread; every backend call runs on that thread
under a deadline. A rollout worker leases a slot, runs episodes on it with the model's raw
text as actions, and releases it (messages: dart_jax.wire.messages, env server section).

Faults stay inside their slot: a call that raises or overruns its deadline ends the
episode as `env_error`, and the slot's backend is killed and restarted before it serves
again. Starting a backend (a browser, a VM's boot) has its own deadline (`start_timeout_s`),
so a call that finds its backend still starting waits for it without spending its own. A lease whose client stops talking for `lease_s` is reclaimed. Bad requests get
typed error replies (the wire Server turns anything else into an `internal` error).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import signal
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any, Callable, Iterator

from dart_jax.wire import Server
from dart_jax.wire.messages import (EnvAcquire, EnvEvaluate, EnvHeartbeat, EnvHeartbeatAck, EnvLease,
                                    EnvListTasks, EnvObservation, EnvRelease, EnvReleased, EnvReply,
                                    EnvReset, EnvReward, EnvSlotStats, EnvStats, EnvStatsRequest, EnvStep,
                                    EnvTaskList, Error, Message)
from envs import actions, dom
from envs.backends import make_env, task_names
from envs.config import EnvServerConfig, SlotSpec
from envs.types import Env, EnvError, Observation, Task, TaskError

log = logging.getLogger(__name__)


class _Refuse(Exception):
    """Answer the request with a typed Error."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.error = Error(code=code, message=message)


@dataclasses.dataclass
class Episode:
    id: str
    task: Task
    obs: Observation
    steps: int = 0
    invalid_steps: int = 0
    done: bool = False
    env_error: bool = False
    ended_invalid: bool = False
    last_reply: EnvReply | None = None


@dataclasses.dataclass
class Lease:
    id: str
    client_id: str
    session: str  # the client's life ("" = none)
    expires: float


class Slot:
    """One environment, its thread, its lease and its counters."""

    def __init__(self, index: int, spec: SlotSpec, spec_index: int, start_timeout_s: float = 600.0):
        self.index, self.spec, self.spec_index = index, spec, spec_index
        self.backend = spec.type
        self.env: Env | None = None
        self.start_timeout_s = start_timeout_s
        self.starting: Future | None = None  # the backend's start on the slot thread
        self.pool = ThreadPoolExecutor(1, thread_name_prefix=f"slot{index}")
        self.lease: Lease | None = None
        self.episode: Episode | None = None
        self.call_lock = threading.Lock()
        self.waiter = threading.Lock()  # held by the one request waiting for call_lock
        self.restarting = False
        self.episodes = self.steps = self.env_errors = self.restarts = 0
        self.window_start, self.busy_s = time.monotonic(), 0.0
        self.call_start: float | None = None  # the call in progress began then

    def busy(self, now: float) -> float:
        """Seconds inside backend calls since `window_start`: finished calls' share of the
        window plus the part of a call in progress (so busy never exceeds the window)."""
        running = self.call_start
        return self.busy_s + (now - max(running, self.window_start) if running is not None else 0.0)

    def reset_window(self, now: float) -> None:
        self.window_start, self.busy_s = now, 0.0
        self.episodes = self.steps = 0

    def call(self, fn: Callable[[Env], Any], timeout_s: float) -> Any:
        """`fn(env)` on the slot thread within `timeout_s`, once the backend has started
        (within `start_timeout_s`; a start that fails raises its error here)."""
        self.call_start = start = time.monotonic()
        try:
            if self.env is None:
                self._wait_started()
            future = self.pool.submit(lambda: fn(self._ensure_env()))
            try:
                return future.result(timeout_s)
            except FutureTimeout:
                self._abandon()
                raise EnvError(f"slot {self.index}: no answer in {timeout_s:g} s") from None
        finally:
            self.call_start = None
            self.busy_s += time.monotonic() - max(start, self.window_start)

    def _wait_started(self) -> None:
        starting = self.starting if self.starting is not None and not self.starting.done() else self._start()
        try:
            starting.result(self.start_timeout_s)
        except FutureTimeout:
            self._abandon()
            raise EnvError(f"slot {self.index}: the {self.backend} backend did not start in "
                           f"{self.start_timeout_s:g} s") from None

    def warm(self) -> None:
        self._start()

    def restart(self) -> None:
        """Kill the backend; a fresh one starts on the slot thread right away."""
        self.restarts += 1
        self.restarting = True
        env, self.env = self.env, None
        _kill(env)
        self._start()

    def _start(self) -> Future:
        self.starting = self.pool.submit(self._ensure_env)
        self.starting.add_done_callback(self._started)
        return self.starting

    def _started(self, future: Future) -> None:
        self.restarting = False
        if not future.cancelled() and future.exception() is not None:
            log.error("slot %d: %s backend failed to start: %s", self.index, self.backend, future.exception())

    def _ensure_env(self) -> Env:
        if self.env is None:
            self.env = make_env(self.spec, self.spec_index)
        return self.env

    def _abandon(self) -> None:
        """The slot thread is stuck in a backend call: kill the backend so the call fails,
        and continue on a new thread (the old one exits when its call returns). The
        caller reports the failure, which restarts the backend."""
        log.error("slot %d: backend call overran its deadline; killing the backend", self.index)
        old, self.pool = self.pool, ThreadPoolExecutor(1, thread_name_prefix=f"slot{self.index}")
        env, self.env = self.env, None
        _kill(env)
        old.shutdown(wait=False, cancel_futures=True)

    def stats(self, now: float) -> EnvSlotStats:
        wall, busy = max(now - self.window_start, 1e-9), self.busy(now)
        state = "restarting" if self.restarting else ("leased" if self.lease else "free")
        return EnvSlotStats(slot=self.index, backend=self.backend, state=state, wall_s=wall,
                            busy_s=busy, utilization=busy / wall,
                            episodes=self.episodes, steps=self.steps, env_errors=self.env_errors,
                            restarts=self.restarts)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        _kill(self.env, close=True)
        self.env = None


def _acquire(slot: Slot, wait_s: float) -> bool:
    """Take the slot's call lock, waiting up to `wait_s` if no other request already waits:
    waiters hold wire threads, so they are bounded by the number of slots."""
    if slot.call_lock.acquire(blocking=False):
        return True
    if wait_s <= 0 or not slot.waiter.acquire(blocking=False):
        return False
    try:
        return slot.call_lock.acquire(timeout=wait_s)
    finally:
        slot.waiter.release()


def _kill(env: Env | None, close: bool = False) -> None:
    """Stop a backend that may be wedged: `kill()` when it has one (processes), else close."""
    if env is None:
        return
    try:
        kill = getattr(env, "kill", None)
        if kill is not None and not close:
            kill()
        else:
            env.close()
    except Exception:
        log.exception("stopping a backend failed")


class EnvServer:
    """The request handler and slot bookkeeping (the wire Server calls `handle`)."""

    def __init__(self, cfg: EnvServerConfig):
        self.cfg = cfg
        self.slots: list[Slot] = []
        for spec in cfg.slots:
            for i in range(spec.count):
                self.slots.append(Slot(len(self.slots), spec, i, cfg.start_timeout_s))
        self.leases: dict[str, Slot] = {}
        self.lock = threading.Lock()
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._reaper = threading.Thread(target=self._reap_forever, name="lease-reaper", daemon=True)
        self._routes: dict[type, Callable[[Any], Message]] = {
            EnvAcquire: self.acquire, EnvHeartbeat: self.heartbeat, EnvReset: self.reset,
            EnvStep: self.step, EnvEvaluate: self.evaluate, EnvRelease: self.release,
            EnvListTasks: self.list_tasks, EnvStatsRequest: self.stats}

    def start(self) -> "EnvServer":
        for slot in self.slots:
            slot.warm()
        self._reaper.start()
        return self

    def close(self) -> None:
        self._stop.set()
        for slot in self.slots:
            slot.close()

    def handle(self, msg: Message) -> Message:
        route = self._routes.get(type(msg))
        if route is None:
            return Error(code="bad_request", message=f"the env server does not serve {type(msg).__name__}")
        try:
            return route(msg)
        except _Refuse as refusal:
            return refusal.error

    def info(self) -> dict:
        """Pong's info: clients check their timeouts against this server's deadlines."""
        free = sum(slot.lease is None for slot in self.slots)
        return {"slots": len(self.slots), "free": free, "reset_timeout_s": self.cfg.reset_timeout_s,
                "step_timeout_s": self.cfg.step_timeout_s, "evaluate_timeout_s": self.cfg.evaluate_timeout_s}

    # ---- leases ------------------------------------------------------------------------

    def acquire(self, msg: EnvAcquire) -> EnvLease:
        with self.lock:
            candidates = [s for s in self.slots if not msg.backend or s.backend == msg.backend]
            if not candidates:
                raise _Refuse("bad_request", f"no {msg.backend!r} slots here "
                              f"(backends: {sorted({s.backend for s in self.slots})})")
            if msg.session:
                self._void_earlier_lives(msg.client_id, msg.session)
            free = [s for s in candidates if s.lease is None]
            if not free:
                raise _Refuse("unavailable", f"all {len(candidates)} slots are leased")
            slot = min(free, key=lambda s: s.restarting or s.env is None)  # a started backend first
            slot.lease = Lease(uuid.uuid4().hex, msg.client_id, msg.session, time.monotonic() + self.cfg.lease_s)
            slot.episode = None
            self.leases[slot.lease.id] = slot
        log.info("slot %d (%s) leased to %s%s", slot.index, slot.backend, msg.client_id,
                 f" (session {msg.session})" if msg.session else "")
        return EnvLease(lease_id=slot.lease.id, slot=slot.index, backend=slot.backend,
                        lease_s=self.cfg.lease_s)

    def _void_earlier_lives(self, client_id: str, session: str) -> None:
        """Leases of `client_id` under another session belong to a life that ended (the
        client restarted): they expire now, and the reaper frees each slot once a call still
        running on it returns. Caller holds `self.lock`."""
        for slot in self.slots:
            lease = slot.lease
            if lease is not None and lease.client_id == client_id and lease.session not in ("", session) \
                    and lease.expires > 0:
                log.warning("slot %d: the lease of %s's earlier session %s is void (it restarted as %s)",
                            slot.index, client_id, lease.session, session)
                lease.expires = 0.0

    def heartbeat(self, msg: EnvHeartbeat) -> EnvHeartbeatAck:
        alive = []
        for lease_id in msg.lease_ids:
            with contextlib.suppress(_Refuse):
                self._leased(lease_id)
                alive.append(lease_id)
        return EnvHeartbeatAck(alive=alive)

    def release(self, msg: EnvRelease) -> EnvReleased:
        slot = self._leased(msg.lease_id)
        with slot.call_lock, self.lock:
            self._free(slot)
        return EnvReleased(lease_id=msg.lease_id)

    def _leased(self, lease_id: str) -> Slot:
        """The slot held by `lease_id`, with its lease renewed."""
        with self.lock:
            slot = self.leases.get(lease_id)
            if slot is None:
                raise _Refuse("not_found", f"lease {lease_id[:12]!r} is unknown, released or reclaimed")
            slot.lease.expires = time.monotonic() + self.cfg.lease_s
            return slot

    def _free(self, slot: Slot) -> None:
        if slot.lease is not None:
            self.leases.pop(slot.lease.id, None)
        slot.lease, slot.episode = None, None

    def _reap_forever(self) -> None:
        while not self._stop.wait(min(1.0, self.cfg.lease_s / 4)):
            now = time.monotonic()
            for slot in self.slots:
                lease = slot.lease
                if lease is None or lease.expires > now or not slot.call_lock.acquire(blocking=False):
                    continue
                try:
                    with self.lock:
                        if slot.lease is lease and lease.expires <= now:
                            log.warning("slot %d: reclaimed from silent client %s", slot.index, lease.client_id)
                            self._free(slot)
                finally:
                    slot.call_lock.release()

    @contextlib.contextmanager
    def _calling(self, lease_id: str, wait_s: float = 0.0) -> Iterator[Slot]:
        """The leased slot, held for one call. A concurrent call on the lease waits up to
        `wait_s` for the running one (one waiter per slot), else is refused."""
        slot = self._leased(lease_id)
        if not _acquire(slot, wait_s):
            raise _Refuse("conflict", "another call on this lease is still running")
        try:
            if slot.lease is None or slot.lease.id != lease_id:
                raise _Refuse("not_found", "the lease was reclaimed")
            yield slot
        finally:
            with self.lock:
                if slot.lease is not None:
                    slot.lease.expires = time.monotonic() + self.cfg.lease_s
            slot.call_lock.release()

    # ---- episodes ----------------------------------------------------------------------

    def reset(self, msg: EnvReset) -> EnvReply:
        try:
            task = Task.from_spec(msg.task)
        except TaskError as e:
            raise _Refuse("bad_request", str(e)) from None
        with self._calling(msg.lease_id) as slot:
            if task.backend != slot.backend:
                raise _Refuse("bad_request", f"task backend {task.backend!r} on a {slot.backend} slot")
            obs, error = None, ""
            for _ in range(self.cfg.reset_retries + 1):
                try:
                    obs = slot.call(lambda env: env.reset(task), self.cfg.reset_timeout_s)
                    break
                except TaskError as e:
                    raise _Refuse("bad_request", str(e)) from None
                except Exception as e:
                    error = self._env_failed(slot, "reset", e)
            slot.episodes += 1
            episode = slot.episode = Episode(uuid.uuid4().hex, task, obs)
            if obs is None:
                episode.done = episode.env_error = True
                slot.env_errors += 1
                return self._reply(slot, "env_error", message=error)
            return self._reply(slot, "ok", obs)

    def step(self, msg: EnvStep) -> EnvReply:
        # A client whose step timed out on the way retries the same step, maybe while the
        # first call still runs: it waits (at most one step deadline) and gets the cached reply.
        with self._calling(msg.lease_id, wait_s=self.cfg.step_timeout_s) as slot:
            episode = slot.episode
            if episode is None:
                raise _Refuse("conflict", "no episode: send EnvReset first")
            if episode.last_reply is not None and msg.step == episode.steps - 1:
                return episode.last_reply  # a retry of the step just done
            if msg.step != episode.steps:
                raise _Refuse("conflict", f"step {msg.step} sent, the episode is at step {episode.steps}")
            if episode.done:
                raise _Refuse("conflict", "the episode is over: evaluate, reset or release")
            screen = (episode.obs.width, episode.obs.height)
            try:
                action = actions.parse(msg.action, screen, self.cfg.image)
            except actions.ActionParseError as e:
                return self._invalid(slot, episode, str(e))
            try:
                result = slot.call(lambda env: env.step(action), self.cfg.step_timeout_s)
            except Exception as e:
                episode.steps += 1
                episode.done = episode.env_error = True
                slot.env_errors += 1
                return self._reply(slot, "env_error", message=self._env_failed(slot, "step", e))
            episode.steps += 1
            slot.steps += 1
            episode.obs, episode.done = result.observation, result.done
            text = actions.render_call(action, screen, self.cfg.image, box_tokens=False)
            return self._reply(slot, "ok", result.observation, action=text)

    def _invalid(self, slot: Slot, episode: Episode, why: str) -> EnvReply:
        episode.steps += 1
        episode.invalid_steps += 1
        if self.cfg.invalid_action == "end":
            episode.done = episode.ended_invalid = True
        return self._reply(slot, "invalid", episode.obs, message=why)

    def evaluate(self, msg: EnvEvaluate) -> EnvReward:
        with self._calling(msg.lease_id) as slot:
            episode = slot.episode
            if episode is None:
                raise _Refuse("conflict", "no episode to evaluate")
            reward, status = 0.0, "failure"
            if episode.env_error:
                status = "env_error"
            elif episode.ended_invalid:
                status = "parse_error"
            else:
                try:
                    raw = float(slot.call(lambda env: env.evaluate(), self.cfg.evaluate_timeout_s))
                    reward = min(max(raw - self.cfg.invalid_penalty * episode.invalid_steps, 0.0), 1.0)
                    status = "success" if reward >= 1.0 else "failure"
                except Exception as e:
                    self._env_failed(slot, "evaluate", e)
                    episode.env_error, status = True, "env_error"
                    slot.env_errors += 1
            return EnvReward(lease_id=msg.lease_id, episode_id=episode.id, reward=reward, status=status,
                             steps=episode.steps, invalid_steps=episode.invalid_steps)

    def _reply(self, slot: Slot, status: str, obs: Observation | None = None, action: str = "",
               message: str = "") -> EnvReply:
        episode = slot.episode
        wire_obs = None if obs is None else EnvObservation(
            screenshot=obs.screenshot, width=obs.width, height=obs.height, instruction=obs.instruction,
            dom_text=dom.with_points(obs.dom_text, lambda p: actions.to_model(p, (obs.width, obs.height),
                                                                               self.cfg.image)))
        reply = EnvReply(lease_id=slot.lease.id, episode_id=episode.id, step=episode.steps, status=status,
                         done=episode.done, observation=wire_obs, action=action, message=message)
        episode.last_reply = reply
        return reply

    def _env_failed(self, slot: Slot, call: str, error: Exception) -> str:
        message = f"{call} failed: {type(error).__name__}: {error}"
        log.error("slot %d (%s): %s; restarting the backend", slot.index, slot.backend, message,
                  exc_info=not isinstance(error, EnvError))
        slot.restart()
        return message

    # ---- introspection -----------------------------------------------------------------

    def list_tasks(self, msg: EnvListTasks) -> EnvTaskList:
        spec = next((s.spec for s in self.slots if s.backend == msg.backend), None)
        if spec is None:
            raise _Refuse("not_found", f"no {msg.backend!r} slots here")
        return EnvTaskList(backend=msg.backend, names=task_names(spec))

    def stats(self, msg: EnvStatsRequest) -> EnvStats:
        now = time.monotonic()
        reply = EnvStats(slots=[slot.stats(now) for slot in self.slots], uptime_s=now - self.started)
        if msg.reset:
            for slot in self.slots:
                slot.reset_window(now)
        return reply


@contextlib.contextmanager
def serving(cfg: EnvServerConfig) -> Iterator[tuple[EnvServer, Server]]:
    """An env server on background threads (tests, benchmarks, the local stack)."""
    envs = EnvServer(cfg).start()
    # per slot: one running call and one retry waiting for it; a few more for everything else
    wire = Server(cfg.wire, envs.handle, role="env-server", workers=2 * len(envs.slots) + 4,
                  info=envs.info).start()
    try:
        yield envs, wire
    finally:
        wire.stop()
        envs.close()


def run(cfg: EnvServerConfig, run_dir: Path | None = None) -> None:
    """Serve until SIGTERM or SIGINT; log slot statistics every minute (and to run_dir)."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with serving(cfg) as (envs, wire):
        log.info("env server on %s with %d slots", wire.endpoint, len(envs.slots))
        while not stop.wait(60.0):
            _log_stats(envs, run_dir)
        _log_stats(envs, run_dir)


def _log_stats(envs: EnvServer, run_dir: Path | None) -> None:
    stats = envs.stats(EnvStatsRequest(reset=False))
    line = {"time": time.time(), "uptime_s": stats.uptime_s,
            "slots": [{f: getattr(s, f) for f in s.__struct_fields__} for s in stats.slots]}
    busy = [s.utilization for s in stats.slots]
    log.info("env server: %d slots, mean utilization %.2f, %d env errors", len(busy),
             sum(busy) / len(busy), sum(s.env_errors for s in stats.slots))
    if run_dir is not None:
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        with open(Path(run_dir) / "env_server_stats.jsonl", "a") as f:
            f.write(json.dumps(line) + "\n")
