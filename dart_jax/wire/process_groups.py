"""Child processes in process groups of their own, and how a group ends.

    proc = spawn(argv, stdout=log)   # subprocess.Popen in a new session: its group is proc.pid
    signal_group(proc.pid, SIGTERM)  # every process of the group; False if it is already gone
    kill(proc, timeout_s=10)         # SIGKILL the group, then reap the leader
    stop(proc, grace_s=20)           # SIGTERM the group; SIGKILL it if the leader outlives the grace
    group_pids(pgid)                 # the group's live processes (/proc)

A child that starts in a session of its own takes everything it starts with it when its group
is killed (a browser's renderers, QEMU, a rollout worker's vLLM engine), and a Ctrl-C to its
parent's group does not reach it. One policy for failures to signal: a group that is already
gone (ProcessLookupError) is not an error; a group this process may not signal
(PermissionError: its number now belongs to another user's processes) is logged and left
alone; anything else is raised. `group_pids` reads /proc (Linux only).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

PROC = Path("/proc")


def spawn(argv: list[str], **popen) -> subprocess.Popen:
    """`subprocess.Popen(argv, **popen)` in a new session, the leader of its own process group."""
    return subprocess.Popen(argv, start_new_session=True, **popen)


def signal_group(pgid: int, sig: int) -> bool:
    """Send `sig` to every process of group `pgid`; False if none was signalled (gone, or not ours)."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        log.warning("process group %d is not this process's to signal (%s): left alone", pgid,
                    signal.Signals(sig).name)
        return False
    return True


def kill(proc: subprocess.Popen, timeout_s: float | None = None) -> int:
    """SIGKILL `proc`'s process group, then reap `proc` (waiting at most `timeout_s`)."""
    signal_group(proc.pid, signal.SIGKILL)
    return proc.wait(timeout_s)


def stop(proc: subprocess.Popen, grace_s: float, kill_group: Callable[[], object] | None = None) -> int:
    """SIGTERM `proc`'s process group and wait up to `grace_s` for `proc` to exit; if it has
    not, `kill_group` (default: SIGKILL the group). Returns `proc`'s exit code."""
    if proc.poll() is None:
        signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            if kill_group is None:
                signal_group(proc.pid, signal.SIGKILL)
            else:
                kill_group()
    return proc.wait()


def processes() -> list[tuple[int, int, str]]:
    """(pid, process group, state) of every process this one can see."""
    out = []
    for entry in PROC.glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone, or not ours to read
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "; comm may hold spaces
        out.append((int(entry.name), int(fields[2]), fields[0]))
    return out


def group_pids(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group `pgid`."""
    return [pid for pid, group, state in processes() if group == pgid and state != "Z"]


def wait_gone(pgid: int, timeout_s: float) -> bool:
    """Wait up to `timeout_s` for group `pgid` to have no live process; whether it has none."""
    deadline = time.monotonic() + timeout_s
    while group_pids(pgid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True
