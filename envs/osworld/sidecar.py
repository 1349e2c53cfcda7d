"""OSWorld's own getters and metrics in a sidecar: desktop-env's environment, a child of
the env server.

    sidecar = EvalSidecar(".venv-osworld-eval/bin/python")
    score = sidecar.evaluate(example, vm_url, last_action, cache_dir, screen, ports)
    sidecar.close()

desktop-env pins torch 2.5, numpy < 2 and transformers 4.35, so it lives in its own
environment (`make setup-osworld-eval` makes `.venv-osworld-eval`). The sidecar
(envs/osworld/sidecar_main.py, run by that environment's Python) is started on first use in
its own process group, registered with envs.reaper so it dies with the env server, and
speaks one JSON object a line over its stdin and stdout. Its answers are read up to
MAX_REPLY_BYTES within a deadline (`start_timeout_s` for the first, desktop-env's import
takes tens of seconds; `call_timeout_s` per evaluation): a sidecar that hangs, dies or
answers nonsense is killed and the call is an EnvError (the episode's `env_error`); the
next call starts a fresh one. An evaluator that raises inside the sidecar is an EnvError
too, carrying its message.
"""

from __future__ import annotations

import json
import math
import os
import select
import subprocess
import tempfile
import time
from pathlib import Path

from dart_jax.wire import process_groups
from envs import reaper
from envs.osworld.checkout import NAME
from envs.types import EnvError, TaskError

MAIN = Path(__file__).resolve().parent / "sidecar_main.py"
VENV = Path(__file__).resolve().parents[2] / ".venv-osworld-eval"
MAX_REPLY_BYTES = 1 << 20


def _cache_base(task_files: Path, task_id: str) -> Path:
    """desktop-env's cache folder for the task: it reads a task's host files from `<base>/<id>`,
    here a link to the episode's folder `task_files`."""
    base = task_files / "osworld-eval"
    base.mkdir(parents=True, exist_ok=True)
    link = base / task_id
    if not link.is_symlink():
        link.symlink_to("../", target_is_directory=True)
    return base


class EvalSidecar:
    """One sidecar process, started on first use (see the module docstring)."""

    def __init__(self, python: str | Path = VENV / "bin" / "python", start_timeout_s: float = 300.0,
                 call_timeout_s: float = 120.0, command: list[str] | None = None):
        """`python`: desktop-env's environment's; `command` replaces `python MAIN` whole."""
        self.python, self.start_timeout_s, self.call_timeout_s = Path(python), start_timeout_s, call_timeout_s
        self.command = command or [str(self.python), str(MAIN)]
        self.process: subprocess.Popen | None = None
        self._buffer = b""

    def evaluate(self, example: dict, vm_url: str, last_action: str | None, task_files: str | Path,
                 screen: tuple[int, int], ports: dict[str, int] | None = None) -> float:
        """OSWorld's DesktopEnv.evaluate of `example` against the VM at `vm_url`; `task_files`:
        the episode's host folder (what its setup left there for cache_file getters, the
        cloud_file files); `ports`: where the guest's browser DevTools (`chromium`) and VLC
        (`vlc`) answer on that host, when not on OSWorld's 9222 and 8080."""
        if not NAME.fullmatch(str(example.get("id"))):  # desktop-env makes a folder of that name
            raise TaskError(f"OSWorld task {str(example.get('id'))[:100]!r}: the sidecar needs a plain id "
                            "(letters, digits, _ . -)")
        self._start()
        request = {"example": example, "vm": vm_url, "last_action": last_action,
                   "cache_dir": str(_cache_base(Path(task_files), example["id"])),
                   "screen": list(screen), "ports": dict(ports or {})}
        try:
            self.process.stdin.write((json.dumps(request) + "\n").encode())
            self.process.stdin.flush()
        except OSError as e:
            self.close()
            raise EnvError(f"OSWorld evaluator sidecar: the request could not be sent ({e})") from None
        reply = self._reply(self.call_timeout_s)
        if "error" in reply:
            raise EnvError(f"OSWorld evaluator sidecar: {str(reply['error'])[:2000]}")
        score = reply.get("score")
        if type(score) not in (int, float) or not math.isfinite(score):
            self.close()
            raise EnvError(f"OSWorld evaluator sidecar: a score that is not a number: {str(score)[:100]}")
        return float(score)

    def _start(self) -> None:
        if self.process is not None and self.process.poll() is None:
            return
        self.close()
        if not Path(self.command[0]).is_file():
            raise EnvError(f"OSWorld evaluator sidecar: no Python at {self.command[0]} (make setup-osworld-eval)")
        self._stderr = tempfile.TemporaryFile()
        self.process = process_groups.spawn(self.command, stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, stderr=self._stderr)
        reaper.watch(self.process.pid)
        if self._reply(self.start_timeout_s) != {"ready": True}:
            self.close()
            raise EnvError("OSWorld evaluator sidecar: it did not say it was ready")

    def _reply(self, timeout_s: float) -> dict:
        """The next line from the sidecar as a JSON object; EnvError (the sidecar killed) on
        a deadline passed, an exit, an over-long line or anything but a JSON object."""
        deadline = time.monotonic() + timeout_s
        fd = self.process.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                self.close()
                raise EnvError(f"OSWorld evaluator sidecar: no answer within {timeout_s:g} s (killed)")
            if not select.select([fd], [], [], left)[0]:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                error = self._error_tail()
                self.close()
                raise EnvError(f"OSWorld evaluator sidecar exited: {error}")
            self._buffer += chunk
            if len(self._buffer) > MAX_REPLY_BYTES:
                self.close()
                raise EnvError(f"OSWorld evaluator sidecar: an answer over {MAX_REPLY_BYTES} bytes")
        line, _, self._buffer = self._buffer.partition(b"\n")
        try:
            reply = json.loads(line)
        except ValueError:
            reply = None
        if not isinstance(reply, dict):
            self.close()
            raise EnvError(f"OSWorld evaluator sidecar: an answer that is not a JSON object: {line[:200]!r}")
        return reply

    def _error_tail(self) -> str:
        self._stderr.seek(0, os.SEEK_END)
        self._stderr.seek(max(0, self._stderr.tell() - 800))
        return self._stderr.read().decode(errors="replace").strip() or "(no stderr)"

    def close(self) -> None:
        process, self.process, self._buffer = self.process, None, b""
        if process is not None:
            process_groups.kill(process, timeout_s=30)
            reaper.forget(process.pid)
            for pipe in (process.stdin, process.stdout):
                pipe.close()
            self._stderr.close()
