"""A child's process group ends whole: the child and what it started, with one policy for a
group that is already gone."""

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dart_jax.wire import process_groups

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc (Linux only)")

# a child that starts a grandchild, then says so; `stubborn` ignores SIGTERM
PARENT = """
import signal, subprocess, sys, time
if sys.argv[1:] == ["stubborn"]:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print("ready", flush=True)
time.sleep(600)
"""


def start(*args: str) -> subprocess.Popen:
    proc = process_groups.spawn([sys.executable, "-c", PARENT, *args], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_a_spawned_child_leads_its_own_group_and_kill_ends_all_of_it():
    proc = start()
    assert len(process_groups.group_pids(proc.pid)) == 2  # the child and its grandchild
    assert process_groups.kill(proc, timeout_s=10) == -signal.SIGKILL
    assert process_groups.wait_gone(proc.pid, 10.0)


def test_stop_sigkills_a_group_that_outlives_the_grace():
    proc = start("stubborn")
    assert process_groups.stop(proc, grace_s=0.5) == -signal.SIGKILL
    assert process_groups.wait_gone(proc.pid, 10.0)


def test_stop_lets_a_group_that_ends_on_sigterm_end():
    proc = start()
    assert process_groups.stop(proc, grace_s=10.0, kill_group=pytest.fail) == -signal.SIGTERM


def test_a_group_that_is_already_gone_is_no_error():
    proc = process_groups.spawn([sys.executable, "-c", "pass"])
    proc.wait()
    assert process_groups.signal_group(proc.pid, signal.SIGKILL) is False
    assert process_groups.kill(proc) == 0
