"""An env server killed with SIGKILL leaves no browser, driver or QEMU process behind."""

import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import psutil
import pytest

from dart_jax.wire.messages import TaskSpec
from envs import reaper
from envs.osworld.qemu import free_port

from tests.envs.conftest import alive, client, run, spec, vm_slots

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SERVER = """
import json, sys
from dart_jax.config import from_dict
from envs.config import EnvServerConfig
from envs.server import run
run(from_dict(EnvServerConfig, json.loads(sys.argv[1]), "test"))
"""


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _kill_server_and_count(slots: list[dict], wanted: tuple[str, ...],
                           reset: TaskSpec | None = None) -> tuple[dict, list[int]]:
    """Start an env server with `slots` (and reset `reset` on it: browsers start on the
    first reset, VMs at once), wait until processes named `wanted` run under it, SIGKILL
    it, and return ({name: count seen before}, [pids of them still alive after])."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    cfg = {"wire": {"endpoint": endpoint}, "slots": slots}
    server = subprocess.Popen([sys.executable, "-c", SERVER, json.dumps(cfg)], cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        if reset is not None:
            run(_reset(endpoint, reset))
        deadline, seen = time.monotonic() + 120, {}
        while time.monotonic() < deadline:
            procs = _descendants(server.pid)
            seen = {name: [p.pid for p in procs if _named(p, name)] for name in wanted}
            if all(seen.values()):
                break
            time.sleep(0.5)
        assert all(seen.values()), f"the env server did not start {wanted}: {seen}"
        time.sleep(1.0)  # the browser's renderers and the like
        pids = [p.pid for p in _descendants(server.pid) if any(_named(p, n) for n in wanted)]
        server.send_signal(signal.SIGKILL)
        server.wait()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(alive(pid) for pid in pids):
            time.sleep(0.2)
        return {name: len(found) for name, found in seen.items()}, [pid for pid in pids if alive(pid)]
    finally:
        server.kill()
        server.wait()


async def _reset(endpoint: str, task: TaskSpec) -> None:
    c = client(endpoint)
    try:
        env = await c.acquire(task.backend, wait_s=60)
        assert (await env.reset(task)).status == "ok"
    finally:
        await c.aclose()


def _named(process: psutil.Process, name: str) -> bool:
    try:
        return name in process.name()
    except psutil.NoSuchProcess:
        return False


@pytest.mark.browser
def test_sigkill_of_the_server_leaves_no_browser_or_driver():
    seen, left = _kill_server_and_count([{"type": "miniwob", "count": 1}], ("chromedriver", "chrom"),
                                        reset=spec("miniwob", "click-test"))
    assert seen["chromedriver"] == 1 and seen["chrom"] >= 2, seen
    assert left == [], f"{len(left)} browser processes outlived the env server"


@pytest.mark.vm
def test_sigkill_of_the_server_leaves_no_qemu():
    slots = vm_slots(count=1)
    slot = {"type": "osworld", "provider": "qemu", "count": 1, "screen_width": 1280, "screen_height": 800,
            "qemu": {"memory_mib": slots.qemu.memory_mib}}
    before = set(glob.glob(os.path.join(tempfile.gettempdir(), "dart-vm-slot0-*")))
    seen, left = _kill_server_and_count([slot], ("qemu-system",))
    assert seen["qemu-system"] == 1 and left == [], f"QEMU outlived the env server: {left}"
    pattern, deadline = os.path.join(tempfile.gettempdir(), "dart-vm-slot0-*"), time.monotonic() + 10
    while not set(glob.glob(pattern)) <= before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert set(glob.glob(pattern)) <= before, f"the killed server's VM left {sorted(set(glob.glob(pattern)) - before)}"


def test_the_watchdog_kills_registered_groups_when_its_pipe_closes(tmp_path):
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
    watchdog = subprocess.Popen([sys.executable, "-m", "envs.reaper"], stdin=subprocess.PIPE, text=True,
                                cwd=ROOT, start_new_session=True)
    kept = subprocess.Popen(["sleep", "60"], start_new_session=True)
    folder, other = tmp_path / "vm one", tmp_path / "kept"
    for f in (folder, other):
        f.mkdir()
        (f / "overlay.qcow2").write_bytes(b"x")
    try:
        watchdog.stdin.write(f"+{sleeper.pid} {folder}\n+{kept.pid} {other}\n-{kept.pid}\n")
        watchdog.stdin.close()  # what the death of the server does
        watchdog.wait(timeout=10)
        assert sleeper.wait(timeout=10) == -signal.SIGKILL and not folder.exists()
        assert kept.poll() is None and other.exists()  # forgotten groups are left alone
    finally:
        for p in (sleeper, kept):
            p.kill()
            p.wait()


def test_the_reaper_restarts_its_watchdog_with_every_live_group():
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        reaper.watch(sleeper.pid)
        first = reaper.watchdog_pid()
        os.kill(first, signal.SIGKILL)
        psutil.Process(first).wait(timeout=10)
        reaper.watch(os.getpid() + 10**6)  # any registration notices and starts a new one
        assert reaper.watchdog_pid() not in (None, first)
        reaper.forget(os.getpid() + 10**6)
    finally:
        reaper.forget(sleeper.pid)
        sleeper.kill()
        sleeper.wait()
