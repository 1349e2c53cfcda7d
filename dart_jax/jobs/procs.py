"""Role processes of a job: start each as its own `dart-jax` process, wait until it
answers Ping, stop it with SIGTERM (then SIGKILL). A job never shares a process with a
role, so a crashing role cannot take the job's state with it."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from dart_jax.wire import Client, RemoteError, WireConfig, WireTimeout
from dart_jax.wire.messages import Ping

log = logging.getLogger(__name__)


class RoleProcess:
    """One `dart-jax ROLE CONFIG [overrides]` child, its stdout/stderr in `log_file`."""

    def __init__(self, role: str, config: Path, overrides: list[str], log_file: Path):
        self.role = role
        log_file.parent.mkdir(parents=True, exist_ok=True)
        self._out = log_file.open("ab")
        argv = [sys.executable, "-m", "dart_jax.cli", role, str(config), *overrides]
        self.proc = subprocess.Popen(argv, stdout=self._out, stderr=subprocess.STDOUT,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        log.info("started %s (pid %d), output in %s", role, self.proc.pid, log_file)

    def wait_ready(self, wire: WireConfig, timeout_s: float) -> None:
        """Block until the role answers Ping; raise if it exits or stays silent."""
        deadline = time.monotonic() + timeout_s
        with Client(wire) as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"{self.role} exited with code {self.proc.returncode} "
                                       f"before it was ready (see {self._out.name})")
                try:
                    client.request(Ping(), timeout_s=1.0)
                    return
                except (WireTimeout, RemoteError):
                    continue
        raise TimeoutError(f"{self.role} did not answer within {timeout_s} s (see {self._out.name})")

    def wait(self, timeout_s: float | None = None) -> int:
        """Block until a job-like role (the trainer) exits; its return code."""
        code = self.proc.wait(timeout_s)
        self._out.close()
        return code

    def stop(self, grace_s: float = 20.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                log.warning("%s ignored SIGTERM for %.0f s; killing it", self.role, grace_s)
                self.proc.kill()
                self.proc.wait()
        if not self._out.closed:
            self._out.close()
        return self.proc.returncode
