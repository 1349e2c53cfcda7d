"""Children of an env server die with it, even when it is killed with SIGKILL.

A browser's driver and a VM's QEMU each run in their own process group (so a wedged one
is killed whole). Nothing inside a SIGKILLed server runs, and Linux's parent-death signal
follows the thread that forked, not the process (slot threads come and go), so a small
watchdog process does it: the server registers each process group it starts on the
watchdog's stdin, and when that pipe closes (the server is gone, however it died) the
watchdog kills every group still registered and exits. The watchdog sits in its own
session, so a signal to the server's process group does not take it along.

    reaper.watch(pgid)    # after starting a process group
    reaper.forget(pgid)   # after killing it
    python -m envs.reaper # the watchdog itself (reads +PGID / -PGID lines)
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading

log = logging.getLogger(__name__)

_lock = threading.Lock()
_watchdog: subprocess.Popen | None = None
_groups: set[int] = set()


def watch(pgid: int) -> None:
    with _lock:
        _groups.add(pgid)
        _send(f"+{pgid}")


def forget(pgid: int) -> None:
    with _lock:
        _groups.discard(pgid)
        _send(f"-{pgid}")


def watchdog_pid() -> int | None:
    return _watchdog.pid if _watchdog is not None and _watchdog.poll() is None else None


def _send(line: str) -> None:
    """Write to the watchdog, starting it (again, with every live group) if needed."""
    global _watchdog
    for _ in range(2):
        if _watchdog is None or _watchdog.poll() is not None:
            _watchdog = subprocess.Popen([sys.executable, "-m", "envs.reaper"], stdin=subprocess.PIPE,
                                         text=True, start_new_session=True,
                                         env={**os.environ, "PYTHONPATH": _import_root()})
            line = "\n".join(f"+{g}" for g in sorted(_groups)) or line
        try:
            _watchdog.stdin.write(line + "\n")
            _watchdog.stdin.flush()
            return
        except (BrokenPipeError, OSError):
            log.warning("the process reaper died; starting a new one")
            _watchdog = None


def _import_root() -> str:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)


def _kill_groups(groups: set[int]) -> None:
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # only the pipe's end stops the watchdog
    groups: set[int] = set()
    for line in sys.stdin:
        line = line.strip()
        if line[:1] in "+-" and line[1:].isdigit():
            (groups.add if line[0] == "+" else groups.discard)(int(line[1:]))
    _kill_groups(groups)


if __name__ == "__main__":
    main()
