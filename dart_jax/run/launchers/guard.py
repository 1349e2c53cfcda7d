"""`python -m dart_jax.run.launchers.guard PARENT_PID ARGV...`: run ARGV so that it, and everything it
starts, dies with process PARENT_PID (a Ray actor), and exit as it exits.

    actor --> guard (this; its own session) --> role (its own session) --> vLLM engine ...

The role runs in a process group of its own, which the guard SIGKILLs as soon as it sees its
parent gone (it looks every WATCH_S), or when it gets KILL_NOW (the actor wants the role gone
at once): a role killed alone would leave its engine processes behind, holding memory and a
GPU that the cluster counts as free. SIGTERM is passed on to the group (a graceful stop).
When the role exits, whatever it left in its group is killed and the guard exits with the
role's code (killed by a signal: the guard dies of the same signal). The parent is watched,
not trusted to PR_SET_PDEATHSIG, which fires when the forking *thread* ends, and an actor
may run its methods on any thread; the role gets PR_SET_PDEATHSIG from this single-threaded
guard, so it dies even if the guard is SIGKILLed. Linux only.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys

from dart_jax.run.launchers.shm_ledger import SegmentLedger
from dart_jax.wire.process_groups import signal_group, spawn

PR_SET_PDEATHSIG = 1
KILL_NOW = signal.SIGUSR1
WATCH_S = 0.5


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def run(parent: int, argv: list[str]) -> int:
    # safe here (single-threaded): preexec_fn is not, in a threaded process such as an actor
    role = spawn(argv, preexec_fn=_die_with_parent)
    segments = SegmentLedger(role.pid)  # its group's shared memory, for a group killed from outside
    signal.signal(signal.SIGTERM, lambda *_: signal_group(role.pid, signal.SIGTERM))
    signal.signal(KILL_NOW, lambda *_: segments.kill())
    while True:
        try:
            code = role.wait(WATCH_S)
            break
        except subprocess.TimeoutExpired:
            segments.note()
            if os.getppid() != parent:  # the actor is gone
                segments.kill()
    segments.kill()  # what the role left behind, in its group and in /dev/shm
    return code


def main() -> None:
    code = run(int(sys.argv[1]), sys.argv[2:])
    if code < 0:  # die of the role's signal, so that our parent sees what it saw
        for sig in (signal.SIGTERM, KILL_NOW):
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


if __name__ == "__main__":
    main()
