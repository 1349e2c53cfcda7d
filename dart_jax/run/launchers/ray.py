"""The Ray launcher: role instances as Ray actors on an existing cluster.

    launcher = RayLauncher(address="10.0.0.2:6379", namespace="dart-jax-run1")  # `ray start --head` ran there
    proc = launcher.start(instance, resources={"GPU": 1})                       # a rollout worker on a GPU node

Each instance is one actor that runs `dart-jax ROLE CONFIG` as a child process, in the
directory `dart-jax run` runs in (the same command a local launch runs; ZeroMQ stays the
data plane, Ray only places and restarts processes). A role binding 0.0.0.0 is reached at
its node's address (`host`).

What is restarted, and by whom:
- the actor's process dies (SIGKILL, OOM, a crashed Ray worker, a lost node): Ray starts
  the actor again (`max_restarts=-1`) on a node with the resources; the new actor starts the
  role again, which resumes from its durable state. The old role's guard
  (dart_jax.run.launchers.guard) sees its actor gone within half a second and kills the old role's
  process group, so nothing it started (a rollout worker's vLLM engine) outlives it. The
  supervisor counts these restarts (`restarts`, from the GCS actor table) and never
  touches the actor.
- the role exits while its actor lives (a crash, a kill of the role alone): the actor
  reports the exit code (`exit_code`), and the supervisor does what it does for a local
  process: it ends that actor and starts a new one after its backoff, counting the
  restart against the row's `max_restarts` (exit code 2, a bad config, stops the run).
- a server that stops answering pings: the supervisor kills the actor and Ray restarts it.
- the supervisor itself (`dart-jax run`) dies: the actors it owns die with it, and their
  roles with them.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import ray

from dart_jax.run.launchers.guard import KILL_NOW
from dart_jax.run.launchers.local import Instance

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
            self.guard = subprocess.Popen(argv, cwd=workdir, stdout=out, stderr=subprocess.STDOUT,
                                          env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)

    def poll(self) -> int | None:
        """The role's exit code (the guard exits as the role does)."""
        return self.guard.poll()

    def pids(self) -> tuple[int, int]:
        """(the actor's process, the guard's; the role is the guard's only child)."""
        return os.getpid(), self.guard.pid

    def host(self) -> str:
        return ray.util.get_node_ip_address()

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


def actor_info(actor) -> dict:
    """The GCS actor table's row of `actor` (State, NumRestarts, Pid, ...). Ray's public state
    API (ray.util.state) goes through the dashboard's HTTP server, which a cluster started
    without the dashboard lacks; this reads the GCS directly."""
    from ray._private import state  # no public API reads an actor's restarts without the dashboard
    return state.actors(actor._actor_id.hex())


class RayProcess:
    """The supervisor's view of one actor: running while Ray keeps it (restarts included)."""

    def __init__(self, actor, name: str):
        self.actor, self.name = actor, name

    def exit_code(self) -> int | None:
        """The role's exit code; None while it runs or while Ray restarts its actor; 1 when
        Ray gave the actor up (its creation failed: Ray's reason goes to this process's log)."""
        try:
            return ray.get(self.actor.poll.remote(), timeout=30)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as e:
            if actor_info(self.actor).get("State") != "DEAD":
                return None
            log.error("Ray gave up the actor of %s: %s", self.name, e)
            return 1

    def host(self) -> str:
        return ray.get(self.actor.host.remote(), timeout=300)

    def restarts(self) -> int:
        """How many times Ray started this actor again."""
        return int(actor_info(self.actor).get("NumRestarts", 0))

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
        """Until the GCS has the actor dead, so that its name is free for the next one."""
        deadline = time.monotonic() + timeout_s
        while actor_info(self.actor).get("State") != "DEAD" and time.monotonic() < deadline:
            time.sleep(0.1)


class RayLauncher:
    """Actors in the namespace of one run (`namespace`), so names never clash across runs
    (a process already connected to Ray keeps the namespace it connected with)."""

    def __init__(self, address: str, namespace: str, workdir: str | None = None):
        if not ray.is_initialized():
            ray.init(address=address or "auto", namespace=namespace, log_to_driver=False)
        self._actor = ray.remote(max_restarts=-1, max_task_retries=0)(RoleActor)
        self.workdir = workdir or os.getcwd()  # where the roles run

    def start(self, instance: Instance, resources: dict | None = None) -> RayProcess:
        """An actor holding `resources` ({"GPU": 1, "CPU": 4, or any custom resource})."""
        resources = dict(resources or {})
        gpus = resources.pop("GPU", 0)
        cpus = resources.pop("CPU", 0)
        actor = self._actor.options(name=instance.name, num_gpus=gpus, num_cpus=cpus,
                                    resources=resources or None).remote(instance, self.workdir)
        return RayProcess(actor, instance.name)
