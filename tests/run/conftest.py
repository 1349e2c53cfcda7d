"""Fixtures of the tests of dart_jax.run: the recorded run, and a Ray cluster.

tests/run/data/run is a run of about 40 seconds recorded with

    PYTHONPATH=$PWD python tests/run/data/emulate.py tests/run/data/run

the real data manager (scheduling, ingest, curation, batch records) driven by emulated
rollout workers (2 x 3 episodes, 8 env slots) and an emulated trainer on the wall clock,
each writing what the real role writes (see that script's docstring). Tests get a copy,
since rendering writes under the run directory.
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

RECORDED = Path(__file__).parent / "data" / "run"


@pytest.fixture
def recorded(tmp_path) -> Path:
    return Path(shutil.copytree(RECORDED, tmp_path / "run"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
