"""SIGKILL a role's process group without leaking the shared memory it held.

    kill_and_release(pgid)   # SIGKILL every process of the group; unlink the segments it orphaned
    ledger = SegmentLedger(pgid); ledger.note() while it runs; ledger.kill() to end it

A vLLM engine's processes talk through ring buffers in /dev/shm (Python's
`multiprocessing.shared_memory`, named `psm_<hex>`, 160-240 MiB each). Their creator unlinks
them on a clean stop, and Python's resource tracker on a crash; a SIGKILL of the whole group
takes the tracker too, so every kill of a rollout worker would leave its buffers behind for
the life of the machine. Before the kill this reads which such segments the group's
processes map (/proc/PID/maps); once the group is gone, each that no live process maps any
more is unlinked. A SegmentLedger also remembers what the group mapped while it ran, for a
group that died before the kill (killed from outside, or its engine alone by the OOM killer).
Only `psm_` segments: the trainer's weight regions (`dart-jax-*`) outlive a reader by design
and reclaim themselves (dart_jax.wire.shm). Linux only; elsewhere it is a plain kill of the group
(dart_jax.wire.process_groups).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable

from dart_jax.wire.process_groups import PROC, group_pids, processes, signal_group, wait_gone

SEGMENT_PREFIX = "/dev/shm/psm_"


def mapped_segments(pids) -> set[str]:
    """The `psm_` segments in /dev/shm that these processes map."""
    found = set()
    for pid in pids:
        try:
            maps = (PROC / str(pid) / "maps").read_text()
        except OSError:
            continue
        found.update(line.split(maxsplit=5)[5] for line in maps.splitlines()
                     if SEGMENT_PREFIX in line and not line.endswith("(deleted)"))
    return found


def kill_and_release(pgid: int, wait_s: float = 5.0, seen: Iterable[str] = ()) -> list[str]:
    """SIGKILL process group `pgid`, wait up to `wait_s` for it to die, then unlink the
    segments it maps now or mapped earlier (`seen`, a SegmentLedger's) that no live process
    maps any more. Returns those unlinked."""
    held = set(seen) | (mapped_segments(group_pids(pgid)) if PROC.is_dir() else set())
    signal_group(pgid, signal.SIGKILL)
    if not held or not wait_gone(pgid, wait_s):
        return []  # nothing held, or the group outlived the wait: leave its segments alone
    orphaned = sorted(path for path in held - mapped_segments(pid for pid, _, _ in processes())
                      if os.path.exists(path))
    for path in orphaned:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    return orphaned


class SegmentLedger:
    """The segments a process group has mapped, noted while it lives (at most every
    `every_s`), for the kill that ends it: a group killed from outside (`kill -9 -PGID`, the
    engine process alone by the OOM killer) is gone before its mappings can be read."""

    def __init__(self, pgid: int, every_s: float = 5.0):
        self.pgid, self.every_s = pgid, every_s
        self.seen: set[str] = set()
        self._next = 0.0

    def note(self) -> None:
        now = time.monotonic()
        if now >= self._next and PROC.is_dir():
            self._next = now + self.every_s
            self.seen |= mapped_segments(group_pids(self.pgid))

    def kill(self, wait_s: float = 5.0) -> list[str]:
        """kill_and_release with what was seen; the ledger starts empty again."""
        released = kill_and_release(self.pgid, wait_s, self.seen)
        self.seen = set()
        return released
