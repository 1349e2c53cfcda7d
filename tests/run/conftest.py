"""Fixtures of the tests of dart_jax.run: a Ray cluster on loopback."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from tests.net import free_port


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory) -> Iterator[str]:
    """A one-node Ray cluster for the session (`ray start --head`, every port chosen now, no
    dashboard); yields its address. Ray names the node by the host's own address even when
    told 127.0.0.1, so that is the address roles on it are reached at; nothing leaves this
    machine. Stopped at the end of the session, this process disconnected first."""
    tmp = tmp_path_factory.mktemp("ray")
    port = free_port()
    argv = [str(Path(sys.executable).with_name("ray")), "start", "--head", "--block", f"--port={port}",
            "--num-cpus=2", "--num-gpus=0", "--include-dashboard=false", f"--dashboard-port={free_port()}",
            f"--dashboard-agent-listen-port={free_port()}", f"--ray-client-server-port={free_port()}",
            "--disable-usage-stats", f"--temp-dir={tmp}"]
    out = open(tmp / "head.log", "w")
    head = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=tmp, start_new_session=True)
    deadline = time.monotonic() + 180
    while "Ray runtime started" not in (tmp / "head.log").read_text():
        if head.poll() is not None or time.monotonic() > deadline:
            os.killpg(head.pid, signal.SIGKILL)
            pytest.fail(f"ray start failed: {(tmp / 'head.log').read_text()[-3000:]}")
        time.sleep(0.5)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        import ray
        ray.shutdown()
        head.send_signal(signal.SIGTERM)  # ray start --block drains the node and stops its processes
        try:
            head.wait(120)
        finally:
            try:
                os.killpg(head.pid, signal.SIGKILL)  # whatever it left behind
            except ProcessLookupError:
                pass
            out.close()
