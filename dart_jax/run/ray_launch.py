"""The Ray launcher: role instances as Ray actors on an existing cluster.

    launcher = RayLauncher(address="10.0.0.2:6379")      # `ray start --head` ran there
    proc = launcher.start(instance, resources={"GPU": 1}) # a rollout worker on a GPU node

Each instance is one actor that runs `dart-jax ROLE CONFIG` as its child process (the same
command a local launch runs; ZeroMQ stays the data plane). The child dies with the actor
(PR_SET_PDEATHSIG), and the actor is restartable without limit: when its process dies,
Ray starts it again on a node with the resources, and the new actor starts the role again,
which resumes from its durable state. The supervisor only reads the actor's state; Ray does
the restarting. A role binding 0.0.0.0 is reached at its node's address (`host`).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time

from dart_jax.run.launch import Instance

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when the actor process that started it dies."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class RoleActor:
    """The actor body (wrapped by ray.remote in RayLauncher)."""

    def __init__(self, instance: Instance):
        self.instance = instance
        instance.log.parent.mkdir(parents=True, exist_ok=True)
        with open(instance.log, "ab") as out:
            self.proc = subprocess.Popen(instance.argv(), stdout=out, stderr=subprocess.STDOUT,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1"}, preexec_fn=_die_with_parent)
        self.started = time.time()

    def poll(self) -> int | None:
        return self.proc.poll()

    def pids(self) -> tuple[int, int]:
        """(the actor's process, the role's process)."""
        return os.getpid(), self.proc.pid

    def host(self) -> str:
        import ray
        return ray.util.get_node_ip_address()

    def stop(self, grace_s: float) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


class RayProcess:
    """The supervisor's view of one actor: running while Ray keeps it (restarts included)."""

    def __init__(self, actor, name: str):
        self.actor, self.name = actor, name

    def exit_code(self) -> int | None:
        import ray
        try:
            return ray.get(self.actor.poll.remote(), timeout=30)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            return None  # dead or restarting: Ray brings it back

    def host(self) -> str:
        import ray
        return ray.get(self.actor.host.remote(), timeout=60)

    def restarts(self) -> int:
        """How many times Ray started the actor again."""
        from ray.util.state import list_actors
        states = list_actors(filters=[("name", "=", self.name)], detail=True)
        return max((int(s.num_restarts or 0) for s in states), default=0)

    def stop(self, grace_s: float = 20.0) -> int | None:
        import ray
        try:
            code = ray.get(self.actor.stop.remote(grace_s), timeout=grace_s + 10)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            code = None
        ray.kill(self.actor, no_restart=True)
        return code

    def kill(self) -> None:
        import ray
        ray.kill(self.actor, no_restart=False)  # a silent role: Ray starts it again


class RayLauncher:
    """Actors in the namespace of one run (`namespace`), so names never clash across runs."""

    def __init__(self, address: str, namespace: str):
        import ray
        if not ray.is_initialized():
            ray.init(address=address or "auto", namespace=namespace, log_to_driver=False)
        self._actor = ray.remote(max_restarts=-1, max_task_retries=0)(RoleActor)

    def start(self, instance: Instance, resources: dict | None = None) -> RayProcess:
        resources = dict(resources or {})
        gpus = resources.pop("GPU", 0)
        cpus = resources.pop("CPU", 0)
        actor = self._actor.options(name=instance.name, num_gpus=gpus, num_cpus=cpus,
                                    resources=resources or None).remote(instance)
        return RayProcess(actor, instance.name)
