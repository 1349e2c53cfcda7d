"""Children of an env server die with it, even when it is killed with SIGKILL.

A browser's driver and a VM's QEMU each run in their own process group (so a wedged one
is killed whole). Nothing inside a SIGKILLed server runs, and Linux's parent-death signal
follows the thread that forked, not the process (slot threads come and go), so a small
watchdog process does it: the server registers each process group it starts on the
watchdog's stdin, and when that pipe closes (the server is gone, however it died) the
watchdog kills every group still registered, removes the folders registered with them (a
VM's overlay and sockets), and exits. The watchdog sits in its own session, so a signal to
the server's process group does not take it along.

    reaper.watch(pgid, folder)  # after starting a process group (folder: optional)
    reaper.forget(pgid)         # after killing it
    python -m envs.reaper       # the watchdog itself (reads "+PGID [FOLDER]" / "-PGID" lines)
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import threading

from dart_jax.wire import process_groups

log = logging.getLogger(__name__)

_lock = threading.Lock()
_watchdog: subprocess.Popen | None = None
_groups: dict[int, str] = {}  # process group -> the folder removed with it ("" for none)


def watch(pgid: int, folder: str | os.PathLike = "") -> None:
    with _lock:
        _groups[pgid] = os.fspath(folder)
        _send(_line(pgid, _groups[pgid]))


def forget(pgid: int) -> None:
    with _lock:
        _groups.pop(pgid, None)
        _send(f"-{pgid}")


def _line(pgid: int, folder: str) -> str:
    return f"+{pgid} {folder}".rstrip()


def watchdog_pid() -> int | None:
    return _watchdog.pid if _watchdog is not None and _watchdog.poll() is None else None


def _send(line: str) -> None:
    """Write to the watchdog, starting it (again, with every live group) if needed."""
    global _watchdog
    for _ in range(2):
        if _watchdog is None or _watchdog.poll() is not None:
            _watchdog = process_groups.spawn([sys.executable, "-m", "envs.reaper"], stdin=subprocess.PIPE,
                                             text=True, env={**os.environ, "PYTHONPATH": _import_root()})
            line = "\n".join(_line(g, f) for g, f in sorted(_groups.items())) or line
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


def _kill_groups(groups: dict[int, str]) -> None:
    for pgid in groups:
        process_groups.signal_group(pgid, signal.SIGKILL)
    for folder in groups.values():
        if folder:
            shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # only the pipe's end stops the watchdog
    groups: dict[int, str] = {}
    for line in sys.stdin:
        head, _, folder = line.strip().partition(" ")
        if head[:1] in "+-" and head[1:].isdigit():
            if head[0] == "+":
                groups[int(head[1:])] = folder
            else:
                groups.pop(int(head[1:]), None)
    _kill_groups(groups)


if __name__ == "__main__":
    main()
