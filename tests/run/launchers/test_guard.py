"""The guard the Ray launcher runs each role under: the role and everything it started die
with the guard's parent, the role's exit is the guard's, SIGTERM reaches the role."""

import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

# A role that starts a grandchild (as a rollout worker starts its vLLM engine), writes both
# pids, then waits; with an argument it exits with that code at once.
ROLE = """
import os, subprocess, sys, time
if len(sys.argv) > 2:
    sys.exit(int(sys.argv[2]))
engine = subprocess.Popen(["sleep", "600"])
open(sys.argv[1], "w").write(f"{os.getpid()} {engine.pid}")
time.sleep(600)
"""
# The actor: starts the guard with itself as the parent, then waits to be killed.
ACTOR = """
import os, subprocess, sys, time
subprocess.Popen([sys.executable, "-m", "dart_jax.run.launchers.guard", str(os.getpid()), *sys.argv[1:]], start_new_session=True)
time.sleep(600)
"""
ROOT = Path(__file__).resolve().parents[3]


def _guard(*args: str) -> list[str]:
    return [sys.executable, "-m", "dart_jax.run.launchers.guard", *args]


@pytest.fixture
def started():
    """The role's and its grandchild's processes, once the role wrote them; killed at the end
    whatever the test's outcome."""
    procs: list[psutil.Process] = []

    def wait_for(pids_file: Path) -> list[psutil.Process]:
        deadline = time.monotonic() + 30
        while not pids_file.exists() or not pids_file.read_text():
            assert time.monotonic() < deadline, "the role never started"
            time.sleep(0.05)
        procs.extend(psutil.Process(int(p)) for p in pids_file.read_text().split())
        return procs[-2:]

    yield wait_for
    for proc in procs:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass


def test_the_role_and_its_children_die_with_the_actor(tmp_path, started):
    actor = subprocess.Popen([sys.executable, "-c", ACTOR, sys.executable, "-c", ROLE, str(tmp_path / "pids")],
                             cwd=ROOT)
    role, engine = started(tmp_path / "pids")
    actor.kill()
    actor.wait()
    _, alive = psutil.wait_procs([role, engine], timeout=10)
    assert not alive


def test_the_guard_exits_as_the_role_does_and_leaves_nothing_behind(tmp_path, started):
    code = subprocess.run(_guard(str(psutil.Process().pid), sys.executable, "-c", ROLE, "x", "3"), cwd=ROOT).returncode
    assert code == 3
    guard = subprocess.Popen(_guard(str(psutil.Process().pid), sys.executable, "-c", ROLE, str(tmp_path / "pids")),
                             cwd=ROOT)
    role, engine = started(tmp_path / "pids")
    role.kill()
    assert guard.wait(10) == -signal.SIGKILL
    _, alive = psutil.wait_procs([engine], timeout=10)
    assert not alive


def test_sigterm_reaches_the_role(tmp_path, started):
    guard = subprocess.Popen(_guard(str(psutil.Process().pid), sys.executable, "-c", ROLE, str(tmp_path / "pids")),
                             cwd=ROOT)
    role, engine = started(tmp_path / "pids")
    guard.send_signal(signal.SIGTERM)
    assert guard.wait(10) == -signal.SIGTERM
    _, alive = psutil.wait_procs([role, engine], timeout=10)
    assert not alive
