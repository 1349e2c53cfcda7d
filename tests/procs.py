"""The processes a test started: found through the process tree (psutil), killed on a cue."""

import signal
import subprocess
import time
from typing import Callable

import psutil


def descendants(pid: int) -> list[psutil.Process]:
    """Every live process under `pid` whose command line can be read ([] once `pid` is gone)."""
    try:
        procs = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    out = []
    for p in procs:
        try:
            p.cmdline()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        out.append(p)
    return out


def kill_when(proc: subprocess.Popen, ready: Callable[[], bool], timeout_s: float = 600) -> None:
    """SIGKILL `proc` as soon as `ready()` holds; fails the test if it exits first or never gets there."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()[-3000:]
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
