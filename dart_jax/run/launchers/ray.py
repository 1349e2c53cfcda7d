"""The Ray launcher: role instances as Ray actors on an existing cluster, placed as Ray places.

    launcher = RayLauncher(address="10.0.0.2:6379", namespace="dart-jax-run1")  # `ray start --head` ran there
    proc = launcher.start(instance, RoleSpec("rollout", count=8, launcher="ray", resources={"GPU": 1}), index=3)

Each row of the placement table gets one placement group (`count` bundles of its `resources`,
the row's `strategy`), reserved before its first actor starts: an instance is the actor in its
bundle, so a restarted instance lands where its resources are held. Each actor runs `dart-jax
ROLE CONFIG` as a child process in the directory `dart-jax run` runs in (the same command a
local launch runs; ZeroMQ stays the data plane, Ray only places and restarts processes). The
code travels with the job: every actor's runtime_env carries this checkout's packages
(`py_modules`: dart_jax, rollout_gpu, envs), so a node needs the dependencies (its host
extra) but not the repository. A role binding 0.0.0.0 is reached at its node's address (`host`).

What is restarted, and by whom:
- the actor's process dies (SIGKILL, OOM, a crashed Ray worker, a lost node): Ray starts
  the actor again, up to the row's `max_restarts` times, in its bundle; the new actor starts
  the role again, which resumes from its durable state. The old role's guard
  (dart_jax.run.launchers.guard) sees its actor gone within half a second and kills the old
  role's process group, so nothing it started (a rollout worker's vLLM engine) outlives it.
  The supervisor counts these restarts (`restarts`: each new actor process it sees) and never
  touches the actor.
- the role exits while its actor lives (a crash, a kill of the role alone): the actor
  reports the exit code (`exit_code`), and the supervisor does what it does for a local
  process: it ends that actor and starts a new one after its backoff, counting the
  restart against the row's `max_restarts` (exit code 2, a bad config, stops the run).
- a server that stops answering pings: the supervisor kills the actor and Ray restarts it.
- the supervisor itself (`dart-jax run`) dies: the actors it owns die with it, and their
  roles with them.
Only Ray's public API is used: an actor Ray is restarting answers ActorUnavailableError, one
it gave up answers ActorDiedError.
"""

from __future__ import annotations

import importlib
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from dart_jax.run.launchers.config import RoleSpec
from dart_jax.run.launchers.guard import KILL_NOW
from dart_jax.run.launchers.local import Instance
from dart_jax.wire.process_groups import spawn

log = logging.getLogger(__name__)


class RoleActor:
    """The actor body (wrapped by ray.remote in RayLauncher): the role under a guard
    (dart_jax.run.launchers.guard), which kills the role's whole process group when the actor dies. Ray
    runs `__init__` again in a fresh process on every restart, so every incarnation starts
    the role anew."""

    def __init__(self, instance: Instance, workdir: str):
        if not Path(workdir).is_dir():
            raise RuntimeError(f"{workdir} (where `dart-jax run` runs) is not on node {self.host()}: "
                               "run it from a directory every node has at the same path")
        logfile = Path(workdir) / instance.log  # relative paths are the supervisor's
        logfile.parent.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "dart_jax.run.launchers.guard", str(os.getpid()), *instance.argv()]
        with open(logfile, "ab") as out:
            self.guard = spawn(argv, cwd=workdir, stdout=out, stderr=subprocess.STDOUT,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def poll(self) -> tuple[int | None, int]:
        """(the role's exit code (the guard exits as the role does), this actor's process id)."""
        return self.guard.poll(), os.getpid()

    def pids(self) -> tuple[int, int]:
        """(the actor's process, the guard's; the role is the guard's only child)."""
        return os.getpid(), self.guard.pid

    def host(self) -> str:
        return ray.util.get_node_ip_address()

    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def stop(self, grace_s: float) -> int | None:
        """SIGTERM the role's process group; SIGKILL it after `grace_s`."""
        if self.guard.poll() is None:
            self.guard.send_signal(signal.SIGTERM)
            try:
                self.guard.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.guard.send_signal(KILL_NOW)
                self.guard.wait()
        return self.guard.returncode


PACKAGES = ("dart_jax", "rollout_gpu", "envs")  # what the runtime_env carries (the wheel's packages)


def code_dirs() -> list[str]:
    """This checkout's package directories, for the runtime_env's py_modules."""
    return [str(Path(importlib.import_module(name).__file__).parent) for name in PACKAGES]


class RayProcess:
    """The supervisor's view of one actor: running while Ray keeps it (restarts included)."""

    def __init__(self, actor, name: str):
        self.actor, self.name = actor, name
        self.pids: set[int] = set()  # the actor processes seen: each one after the first is a restart

    def exit_code(self) -> int | None:
        """The role's exit code; None while it runs or while Ray restarts its actor; 1 when
        Ray gave the actor up (its creation failed or its restarts ran out: Ray's reason goes
        to this process's log)."""
        try:
            code, pid = ray.get(self.actor.poll.remote(), timeout=30)
        except (ray.exceptions.ActorUnavailableError, ray.exceptions.GetTimeoutError):
            return None
        except ray.exceptions.RayActorError as e:
            if not self._dead():
                return None
            log.error("Ray gave up the actor of %s: %s", self.name, e)
            return 1
        self.pids.add(pid)
        return code

    def _dead(self) -> bool:
        """Whether Ray has the actor dead for good: an actor it restarts queues the call."""
        try:
            ray.get(self.actor.poll.remote(), timeout=30)
        except ray.exceptions.ActorDiedError:
            return True
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            pass
        return False

    def host(self) -> str:
        return ray.get(self.actor.host.remote(), timeout=300)

    def node(self) -> str:
        return ray.get(self.actor.node.remote(), timeout=300)

    def restarts(self) -> int:
        """How many times Ray started this actor again (restarts between two looks count once)."""
        return max(0, len(self.pids) - 1)

    def stop(self, grace_s: float = 20.0) -> int | None:
        try:
            code = ray.get(self.actor.stop.remote(grace_s), timeout=grace_s + 10)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            code = None
        ray.kill(self.actor, no_restart=True)
        self._wait_dead()
        return code

    def kill(self) -> None:
        ray.kill(self.actor, no_restart=False)  # a silent role: Ray starts it again

    def _wait_dead(self, timeout_s: float = 30.0) -> None:
        """Until Ray has the actor dead, so that its name is free for the next one."""
        deadline = time.monotonic() + timeout_s
        while not self._dead() and time.monotonic() < deadline:
            time.sleep(0.1)


class RayLauncher:
    """Actors in the namespace of one run (`namespace`), so names never clash across runs
    (a process already connected to Ray keeps the namespace it connected with)."""

    def __init__(self, address: str, namespace: str, workdir: str | None = None, ready_timeout_s: float = 300.0):
        if not ray.is_initialized():
            ray.init(address=address or "auto", namespace=namespace, log_to_driver=False,
                     runtime_env={"py_modules": code_dirs()})
        self.workdir = workdir or os.getcwd()  # where the roles run
        self.ready_timeout_s = ready_timeout_s
        self.groups: dict[str, PlacementGroup] = {}  # placement row -> its group

    def group(self, spec: RoleSpec) -> PlacementGroup:
        """The row's placement group, reserved (and waited for) on its first instance."""
        key = f"{spec.role}:{spec.count}:{sorted(spec.resources.items())}"
        if key not in self.groups:
            pg = placement_group([bundle(spec.resources)] * spec.count, strategy=spec.strategy)
            try:
                ray.get(pg.ready(), timeout=self.ready_timeout_s)
            except ray.exceptions.GetTimeoutError:
                remove_placement_group(pg)
                raise RuntimeError(f"Ray could not place {spec.count} x {spec.role} ({bundle(spec.resources)} each, "
                                   f"{spec.strategy}) within {self.ready_timeout_s:.0f} s: the cluster lacks "
                                   "those resources (`ray status`)") from None
            self.groups[key] = pg
        return self.groups[key]

    def start(self, instance: Instance, spec: RoleSpec, index: int = 0) -> RayProcess:
        """The actor of instance `index` of `spec`'s row, in its bundle (`resources`: GPU and
        CPU become num_gpus/num_cpus, anything else a custom resource of the nodes)."""
        resources = dict(spec.resources)
        gpus, cpus = resources.pop("GPU", 0), resources.pop("CPU", 0)
        strategy = PlacementGroupSchedulingStrategy(self.group(spec), placement_group_bundle_index=index)
        actor = ray.remote(max_restarts=spec.max_restarts, max_task_retries=0)(RoleActor).options(
            name=instance.name, num_gpus=gpus, num_cpus=cpus, resources=resources or None,
            scheduling_strategy=strategy).remote(instance, self.workdir)
        return RayProcess(actor, instance.name)

    def release(self) -> None:
        """Free every placement group (after the run stopped their actors)."""
        for pg in self.groups.values():
            remove_placement_group(pg)
        self.groups.clear()


def bundle(resources: dict[str, float]) -> dict[str, float]:
    """A bundle holds the row's resources; a row without any holds a share of nothing but a
    CPU slot, so it is still a place."""
    return dict(resources) or {"CPU": 0.001}
