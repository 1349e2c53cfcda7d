"""Fixtures of the tests of dart_jax.run: a two-node Ray cluster on this machine."""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest

from dart_jax.wire import process_groups
from tests.net import free_port


NODES = {"envs": {"envs": 2}, "rollout": {"rollout": 1}}  # node -> its custom resources (a GPU node's stand-in)


def _ray_start(tmp: Path, name: str, args: list[str]) -> subprocess.Popen:
    """`ray start --block` for one node, without this checkout on PYTHONPATH: actors get the
    code from the job's runtime_env."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    argv = [str(Path(sys.executable).with_name("ray")), "start", "--block", "--num-gpus=0", "--disable-usage-stats",
            f"--node-manager-port={free_port()}", f"--object-manager-port={free_port()}",
            f"--dashboard-agent-listen-port={free_port()}", f"--dashboard-agent-grpc-port={free_port()}",
            f"--runtime-env-agent-port={free_port()}", f"--metrics-export-port={free_port()}", *args]
    out = open(tmp / f"{name}.log", "w")
    node = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=tmp, start_new_session=True, env=env)
    deadline = time.monotonic() + 180
    while "This command will now block" not in (tmp / f"{name}.log").read_text():
        if node.poll() is not None or time.monotonic() > deadline:
            process_groups.kill(node)
            pytest.fail(f"ray start failed: {(tmp / f'{name}.log').read_text()[-3000:]}")
        time.sleep(0.5)
    return node


def _ray_stop(node: subprocess.Popen) -> None:
    node.send_signal(signal.SIGTERM)  # ray start --block drains the node and stops its processes
    try:
        node.wait(120)
    finally:
        process_groups.signal_group(node.pid, signal.SIGKILL)  # whatever it left behind


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory) -> Iterator[str]:
    """A two-node Ray cluster for the session on this machine: the head holds the `envs`
    resource (an env pool's node), a second `ray start` the `rollout` one (a GPU node's
    stand-in); every port chosen now, no dashboard. Yields the head's address. Ray names both
    nodes by the host's own address even when told 127.0.0.1, so that is the address roles on
    them are reached at; nothing leaves this machine. Stopped at the end of the session (the
    worker node first), this process disconnected first. Ray's own files go to a short folder
    of /tmp: its socket paths must fit AF_UNIX's 107 bytes, which pytest's base folder under an
    xdist worker (.../pytest-N/popen-gw0/) does not leave room for."""
    tmp = tmp_path_factory.mktemp("ray")
    ray_tmp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    port = free_port()
    head = _ray_start(tmp, "head", ["--head", f"--port={port}", "--num-cpus=2", "--include-dashboard=false",
                                    f"--dashboard-port={free_port()}", f"--ray-client-server-port={free_port()}",
                                    f"--resources={json.dumps(NODES['envs'])}", f"--temp-dir={ray_tmp}"])
    nodes = [head]
    try:
        nodes.append(_ray_start(tmp, "rollout", [f"--address=127.0.0.1:{port}", "--num-cpus=2",
                                                 f"--resources={json.dumps(NODES['rollout'])}"]))
        yield f"127.0.0.1:{port}"
    finally:
        import ray
        ray.shutdown()
        for node in reversed(nodes):
            _ray_stop(node)
        shutil.rmtree(ray_tmp, ignore_errors=True)
