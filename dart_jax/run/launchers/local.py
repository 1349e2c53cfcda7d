"""Launchers: how the supervisor starts one role instance, and what it gets back.

    proc = LocalLauncher().start(Instance(...))   # `dart-jax ROLE CONFIG`, its own session
    proc.exit_code()                              # None while it runs
    proc.stop(grace_s=20)                         # SIGTERM to its process group, then SIGKILL

Every instance runs `dart-jax ROLE CONFIG` with its own config file; the local launcher
starts it as a process in a new session, so stopping it reaches everything it started
(a rollout worker's vLLM engine processes) and nothing is left behind. The Ray launcher
(dart_jax.run.launchers.ray) places the same command in a Ray actor.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Protocol

from dart_jax.run.launchers.shm_ledger import SegmentLedger
from dart_jax.wire import process_groups


COMMANDS = {"data-manager": "data-manager", "env-server": "env-server", "rollout": "rollout", "trainer": "train"}


@dataclasses.dataclass(frozen=True)
class Instance:
    """One process of a role: `dart-jax ROLE CONFIG`, output appended to `log`."""
    name: str  # "rollout-1"
    role: str  # a role of the placement table
    config: Path
    log: Path
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = dataclasses.field(default_factory=dict)  # on top of the supervisor's (its devices)

    def argv(self) -> list[str]:
        return [sys.executable, "-m", "dart_jax.cli", COMMANDS[self.role], str(self.config), *self.extra_args]


class Process(Protocol):
    def exit_code(self) -> int | None: ...

    def stop(self, grace_s: float = 20.0) -> int | None: ...

    def kill(self) -> None: ...


class LocalProcess:
    """One instance in its own session, with a temporary directory of its own (TMPDIR, and
    vLLM's ipc sockets: VLLM_RPC_BASE_PATH) removed once its group is gone: what Chromium,
    vLLM, QEMU and Python put there would otherwise stay behind after every kill (a test suite
    left 77 sockets, 3 vllm_dist_* files and Chromium's scoped directories in /tmp)."""

    def __init__(self, instance: Instance):
        instance.log.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix=f"dart-jax-{instance.name}-"))
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "TMPDIR": str(self.tmp), "VLLM_RPC_BASE_PATH": str(self.tmp),
               **instance.env}
        with open(instance.log, "ab") as out:
            self.proc = process_groups.spawn(instance.argv(), stdout=out, stderr=subprocess.STDOUT, env=env)
        self.pid = self.proc.pid
        self.segments = SegmentLedger(self.pid)

    def exit_code(self) -> int | None:
        """None while it runs; the supervisor asks every round, and each answer also notes
        (every few seconds) the shared memory its group maps, for the kill that ends it."""
        code = self.proc.poll()
        if code is None:
            self.segments.note()
        return code

    def stop(self, grace_s: float = 20.0) -> int | None:
        """SIGTERM the instance's process group; SIGKILL what is left after `grace_s`."""
        process_groups.stop(self.proc, grace_s, kill_group=self.segments.kill)
        self.segments.kill()  # children that outlived their parent, and what the group left in /dev/shm
        self._remove_tmp()
        return self.proc.returncode

    def kill(self) -> None:
        self.segments.kill()
        self.proc.wait()
        self._remove_tmp()

    def _remove_tmp(self, wait_s: float = 5.0) -> None:
        """The instance's temporary directory, once no process of its group is left to use it
        (a child SIGKILLed with its group is still dying for a moment after its leader is reaped)."""
        if process_groups.wait_gone(self.pid, wait_s):
            shutil.rmtree(self.tmp, ignore_errors=True)


class LocalLauncher:
    def start(self, instance: Instance, spec=None, index: int = 0) -> LocalProcess:
        """A process on this machine (the placement row `spec` matters to cluster launchers)."""
        return LocalProcess(instance)
