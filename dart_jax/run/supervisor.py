"""The supervisor of a run: every role as its own process, from the placement table.

    with Supervisor(cfg, run) as sup:
        sup.start({"data-manager", "env-server"})    # waits until each answers Ping
        sup.start({"rollout", "trainer"}, cfg=rl_cfg)
        sup.wait_done("trainer", on_tick=view.update)   # until the trainer exits 0
    # leaving the block stops every process it started (SIGTERM, then SIGKILL)

Each instance gets its own config file (runs/<name>/roles/<instance>.yaml: the run config
with that instance's worker id and endpoints) and a launcher (`local` processes here;
`ray` actors on a cluster, where Ray itself restarts an actor whose process dies: see
dart_jax.run.launchers.ray; `tpu`, the trainer on a Cloud TPU slice, watched through its
heartbeats to the data manager: dart_jax.run.launchers.slice). An env server a launcher placed on a node of its choosing and
bound to 0.0.0.0 is pinged, and reached by rollout workers, at that node's address.
Watching: processes are polled, servers (data manager, env servers) are pinged every
`run.heartbeat_s` and one that misses three pings in a row is killed (one that has not
answered since it started is given `run.ready_timeout_s` first). A dead instance is
started again after a backoff (1, 2, 4 .. 30 s), from its durable state (a trainer resumes
from its last checkpoint, a data manager reopens its store); one that dies more than
`max_restarts` times stops the run with one message naming it and its log; one that exits
with code 2 (a bad config) stops it at once. A trainer that exits 0 has finished.
"""

from __future__ import annotations

import dataclasses
import logging
import socket
import time
from pathlib import Path
from typing import Callable, Iterable

from dart_jax.config import dump
from dart_jax.rundir import RunDir
from dart_jax.run.launchers.local import Instance, LocalLauncher, Process
from dart_jax.run.schema import RunConfig
from dart_jax.run.launchers.config import RoleSpec
from dart_jax.run.devices import instance_env
from dart_jax.wire import Client, RemoteError, WireConfig, WireTimeout
from dart_jax.wire.messages import Ping

log = logging.getLogger(__name__)
SERVERS = ("data-manager", "env-server")
ORDER = ("data-manager", "env-server", "trainer", "rollout")  # start order; stop in reverse
MISSES = 3


class RunFailed(RuntimeError):
    """The run cannot go on; the message names the role and its log."""


@dataclasses.dataclass
class Member:
    instance: Instance
    spec: RoleSpec
    ping: WireConfig | None  # as the server binds it
    index: int = 0  # of the instance in its placement row
    process: Process | None = None
    host: str | None = None  # the node it runs on (cluster launchers)
    restarts: int = 0  # the supervisor's
    cluster_restarts: int = 0  # the cluster's (Ray) of processes this member has replaced
    restart_at: float = 0.0
    misses: int = 0
    started_at: float = 0.0
    answered: bool = False  # since its last start: until then a missed ping is a slow start, not a hang
    done: bool = False


def instance_configs(cfg: RunConfig, role: str, count: int, hosts: dict[str, str] | None = None) -> list[RunConfig]:
    """The config of each instance of `role`: env servers on endpoints of their own, rollout
    workers with their own ids and every env server's endpoint. A server bound to all
    interfaces (tcp://0.0.0.0:PORT) is reached at the address of the host it runs on (`hosts`:
    endpoint -> host): env servers and the trainer's weights by rollout workers, the data
    manager by rollout workers and the trainer."""
    hosts = hosts or {}
    envs = cfg.env_wires()
    if role == "env-server":
        return [dataclasses.replace(cfg, envs=dataclasses.replace(cfg.envs, wire=w)) for w in envs]
    if role not in ("rollout", "trainer"):
        return [cfg] * count
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(
        cfg.data, wire=_reachable(cfg.data.wire, hosts.get(cfg.data.wire.endpoint))))
    if role == "trainer":
        return [cfg] * count
    servers = cfg.rollout.env_servers or tuple(_reachable(w, hosts.get(w.endpoint)) for w in envs)
    w = cfg.weights
    cfg = dataclasses.replace(cfg, weights=dataclasses.replace(
        w, announce=_reachable(w.announce, hosts.get(w.announce.endpoint)),
        serve=_reachable(w.serve, hosts.get(w.serve.endpoint))))
    return [dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, worker_id=f"rollout-{i}",
                                                                 env_servers=servers)) for i in range(count)]


def with_memory_fraction(cfg: RunConfig, spec: RoleSpec) -> RunConfig:
    """A rollout row's `memory_fraction`, when said, as its engine's share of each device."""
    if spec.role != "rollout" or not spec.memory_fraction:
        return cfg
    engine = dataclasses.replace(cfg.rollout.engine, gpu_memory_utilization=spec.memory_fraction)
    return dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, engine=engine))


def _reachable(wire: WireConfig, host: str | None) -> WireConfig:
    if host is None or not wire.endpoint.startswith("tcp://0.0.0.0:"):
        return wire
    return dataclasses.replace(wire, endpoint=wire.endpoint.replace("0.0.0.0", host, 1))


class Supervisor:
    def __init__(self, cfg: RunConfig, run: RunDir, launchers: dict | None = None):
        self.cfg, self.run = cfg, run
        self.launchers = launchers or {"local": LocalLauncher()}
        self.members: list[Member] = []
        self.hosts: dict[str, str | None] = {}  # server endpoint -> the node it runs on (None: this machine)
        self._stopped: dict[str, int] = {}  # restarts of instances already stopped (an earlier phase)
        self._last_ping = 0.0

    def launcher(self, name: str):
        if name == "tpu" and name not in self.launchers:
            from dart_jax.run.launchers.slice import SliceLauncher
            self.launchers[name] = SliceLauncher(self.cfg)
        if name not in self.launchers:  # the Ray launcher connects when a role first needs it
            from dart_jax.run.launchers.ray import RayLauncher  # Ray, an optional dependency: on first use
            self.launchers[name] = RayLauncher(self.cfg.run.ray_address, namespace=f"dart-jax-{self.cfg.run.name}",
                                               ready_timeout_s=self.cfg.run.ready_timeout_s)
        return self.launchers[name]

    def __enter__(self) -> "Supervisor":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- starting
    def start(self, roles: Iterable[str], cfg: RunConfig | None = None, extra_args: tuple[str, ...] = ()) -> None:
        """Start every instance of `roles` from the placement table (with `cfg`, default the
        run's); wait until the servers among them answer Ping."""
        cfg = cfg or self.cfg
        roles = set(roles)
        for spec in sorted((s for s in cfg.run.placement if s.role in roles), key=lambda s: ORDER.index(s.role)):
            hosts = {e: h or self.this_host() for e, h in self.hosts.items() if e.startswith("tcp://0.0.0.0:")}
            tp = cfg.rollout.engine.tensor_parallel_size
            for i, icfg in enumerate(instance_configs(cfg, spec.role, spec.count, hosts)):
                name = spec.role if spec.count == 1 else f"{spec.role}-{i}"
                config = self.run.root / "roles" / f"{name}.yaml"
                config.parent.mkdir(exist_ok=True)
                config.write_text(dump(with_memory_fraction(icfg, spec)))
                ping = icfg.data.wire if spec.role == "data-manager" else icfg.envs.wire if spec.role == "env-server" else None
                member = Member(Instance(name, spec.role, config, self.run.log_path(f"{name}.out"), extra_args,
                                         env=instance_env(spec, i, tp)), spec, ping, index=i)
                self._launch(member)
                self.members.append(member)
                if member.ping is not None:
                    self.hosts[member.ping.endpoint] = member.host
                if spec.role == "trainer":  # process 0 serves the weights
                    for w in (icfg.weights.announce, icfg.weights.serve):
                        self.hosts[w.endpoint] = member.host
        for member in self.members:
            if member.instance.role in roles and member.ping is not None:
                self._wait_ready(member)

    def _launch(self, member: Member) -> None:
        member.process = self.launcher(member.spec.launcher).start(member.instance, member.spec, member.index)
        member.host = member.process.host() if hasattr(member.process, "host") else None
        member.misses, member.answered, member.started_at = 0, False, time.monotonic()
        log.info("started %s (%s)", member.instance.name, member.spec.launcher)

    def _wait_ready(self, member: Member) -> None:
        deadline = time.monotonic() + self.cfg.run.ready_timeout_s
        with Client(dataclasses.replace(_reachable(member.ping, member.host), timeout_s=1.0)) as client:
            while time.monotonic() < deadline:
                if (code := member.process.exit_code()) is not None:
                    raise RunFailed(f"{member.instance.name} exited with code {code} before it was ready "
                                    f"(see {member.instance.log})")
                try:
                    client.request(Ping())
                    member.answered = True
                    return
                except (WireTimeout, RemoteError):
                    continue
        raise RunFailed(f"{member.instance.name} did not answer within {self.cfg.run.ready_timeout_s:.0f} s "
                        f"(see {member.instance.log})")

    def this_host(self) -> str:
        """This machine's address as other hosts reach it: Ray's for its node, when a Ray
        launcher is in use (a cluster on loopback names it so too), else its hostname's."""
        if "ray" in self.launchers:
            import ray
            return ray.util.get_node_ip_address()
        return socket.gethostbyname(socket.gethostname())

    # -- watching
    def poll(self) -> None:
        """One round of watching: restart the dead, kill the silent."""
        now = time.monotonic()
        ping = now - self._last_ping >= self.cfg.run.heartbeat_s
        self._last_ping = now if ping else self._last_ping
        for member in self.members:
            if member.done:
                continue
            code = member.process.exit_code() if member.process is not None else None
            if member.process is not None and code is None:
                if ping and member.ping is not None:
                    self._heartbeat(member)
                continue
            if member.process is not None:
                self._died(member, code)
            elif now >= member.restart_at:
                self._launch(member)

    def _heartbeat(self, member: Member) -> None:
        try:
            timeout_s = min(2.0, self.cfg.run.heartbeat_s)
            with Client(dataclasses.replace(_reachable(member.ping, member.host), timeout_s=timeout_s)) as client:
                client.request(Ping())
            member.misses, member.answered = 0, True
        except (WireTimeout, RemoteError):
            if not member.answered:  # still starting (imports, a store's recovery): bounded by ready_timeout_s
                if time.monotonic() - member.started_at > self.cfg.run.ready_timeout_s:
                    log.warning("%s did not answer within %.0f s of its start: killing it",
                                member.instance.name, self.cfg.run.ready_timeout_s)
                    member.process.kill()
                return
            member.misses += 1
            if member.misses >= MISSES:
                log.warning("%s missed %d heartbeats: killing it", member.instance.name, MISSES)
                member.process.kill()

    def _died(self, member: Member, code: int) -> None:
        name = member.instance.name
        if code == 0 and member.instance.role == "trainer":
            member.done = True
            log.info("%s finished", name)
            return
        if code == 2:  # the CLI's exit code for a bad config or argument: a restart cannot help
            raise RunFailed(f"{name} refused its config (exit code 2; see {member.instance.log})")
        if member.restarts >= member.spec.max_restarts:
            raise RunFailed(f"{name} died {member.restarts + 1} times (last exit code {code}); the run stops "
                            f"(see {member.instance.log})")
        delay = min(30.0, 2.0 ** member.restarts)
        member.restarts += 1
        member.cluster_restarts += self._cluster_restarts(member.process)
        member.process.stop()  # a Ray actor whose role exited: end it; a new one starts below
        member.process, member.restart_at = None, time.monotonic() + delay
        log.warning("%s exited with code %s; restart %d of %d in %.0f s (see %s)", name, code, member.restarts,
                    member.spec.max_restarts, delay, member.instance.log)

    def wait_done(self, role: str, on_tick: Callable[[], None] | None = None, period_s: float = 1.0) -> None:
        """Watch everything until every instance of `role` has finished (exit code 0)."""
        while not all(m.done for m in self.members if m.instance.role == role):
            self.poll()
            if on_tick is not None:
                on_tick()
            time.sleep(period_s)

    # -- stopping
    def stop(self, roles: Iterable[str] | None = None) -> None:
        """Stop the instances of `roles` (default: all), the last-started roles first."""
        roles = set(ORDER if roles is None else roles)
        for member in sorted((m for m in self.members if m.instance.role in roles),
                             key=lambda m: -ORDER.index(m.instance.role)):
            name, restarts = member.instance.name, self._restarts_of(member)
            if member.process is not None:
                member.process.stop()
            self._stopped[name] = self._stopped.get(name, 0) + restarts
        self.members = [m for m in self.members if m.instance.role not in roles]
        if not self.members:
            for launcher in self.launchers.values():
                getattr(launcher, "release", lambda: None)()

    @staticmethod
    def _cluster_restarts(process: Process | None) -> int:
        return process.restarts() if hasattr(process, "restarts") else 0

    def _restarts_of(self, member: Member) -> int:
        """The supervisor's restarts of an instance, and the cluster's own (Ray)."""
        return member.restarts + member.cluster_restarts + self._cluster_restarts(member.process)

    def restarts(self) -> dict[str, int]:
        """Restarts of each instance over the whole run, stopped ones included."""
        counts = dict(self._stopped)
        for member in self.members:
            counts[member.instance.name] = counts.get(member.instance.name, 0) + self._restarts_of(member)
        return counts
