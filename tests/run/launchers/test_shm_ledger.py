"""A SIGKILLed process group leaves no shared memory behind that it alone held: the way a
killed rollout worker's vLLM engine would leave its ring buffers in /dev/shm for good."""

import signal
import subprocess
import sys
from multiprocessing import shared_memory
from pathlib import Path

import pytest

from dart_jax.run.launchers.shm_ledger import SegmentLedger, kill_and_release, mapped_segments
from dart_jax.wire.process_groups import group_pids, signal_group

pytestmark = pytest.mark.skipif(not Path("/dev/shm").is_dir() or not Path("/proc").is_dir(), reason="Linux only")

# a group as vLLM makes one: a creator (which starts Python's resource tracker, in the same
# group) and a child that maps the segment by name; `attach` is one more segment it maps
HOLDER = """
import subprocess, sys, time
from multiprocessing import shared_memory
own = shared_memory.SharedMemory(create=True, size=1 << 20)
other = shared_memory.SharedMemory(name=sys.argv[1]) if len(sys.argv) > 1 else None
reader = subprocess.Popen([sys.executable, "-c",
    "import sys, time; from multiprocessing import shared_memory as s; m = s.SharedMemory(name=sys.argv[1]); "
    "print('ready', flush=True); time.sleep(600)", own.name], stdout=subprocess.PIPE, text=True)
reader.stdout.readline()
print(own.name, flush=True)
time.sleep(600)
"""


def start_group(*args: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, *args], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    return proc, proc.stdout.readline().strip()


def test_the_segments_a_killed_group_held_alone_are_unlinked():
    proc, name = start_group()
    path = f"/dev/shm/{name}"
    assert len(group_pids(proc.pid)) >= 3  # creator, its resource tracker, the reader
    assert path in mapped_segments(group_pids(proc.pid))
    assert kill_and_release(proc.pid) == [path]
    proc.wait()
    assert not Path(path).exists() and group_pids(proc.pid) == []


def test_a_segment_someone_outside_the_group_still_maps_is_left_alone():
    ours = shared_memory.SharedMemory(create=True, size=1 << 16)  # this process maps it
    try:
        proc, name = start_group(ours.name)
        assert kill_and_release(proc.pid) == [f"/dev/shm/{name}"]
        proc.wait()
        assert Path(f"/dev/shm/{ours.name}").exists()
        ours.buf[0] = 7  # still usable
    finally:
        ours.close()
        ours.unlink()


def test_a_group_that_is_already_gone_is_no_error():
    proc = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    proc.wait()
    assert kill_and_release(proc.pid) == []


def test_a_group_killed_from_outside_is_cleaned_after_from_what_was_noted():
    proc, name = start_group()
    ledger = SegmentLedger(proc.pid, every_s=0.0)
    ledger.note()  # as the supervisor's rounds do while the role runs
    signal_group(proc.pid, signal.SIGKILL)  # `kill -9 -PGID`, not through the launcher
    proc.wait()
    assert Path(f"/dev/shm/{name}").exists()  # what a plain kill leaves
    assert ledger.kill() == [f"/dev/shm/{name}"]
    assert not Path(f"/dev/shm/{name}").exists() and ledger.seen == set()
