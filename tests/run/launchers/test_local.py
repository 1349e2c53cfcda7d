"""The local launcher's instance: a temporary directory of its own (TMPDIR, vLLM's ipc
sockets), removed once its process group is gone, however it ended (stopped, or killed from
outside and then reaped by the supervisor)."""

import json
import signal
import sys
import time
from pathlib import Path

import pytest

from dart_jax.run.launchers.local import Instance, LocalProcess
from dart_jax.wire.process_groups import group_pids, signal_group

# writes into its temporary directory (a file, a unix socket, as vLLM and Chromium do), starts
# a child in its group, reports, and waits
LEAVER = ("import json, os, socket, subprocess, sys, tempfile, time\n"
          "d = tempfile.gettempdir(); open(os.path.join(d, 'vllm_dist_x'), 'w').write('x')\n"
          "s = socket.socket(socket.AF_UNIX); s.bind(os.path.join(os.environ['VLLM_RPC_BASE_PATH'], 'ipc-uuid'))\n"
          "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
          "print(json.dumps({'tmp': d, 'rpc': os.environ['VLLM_RPC_BASE_PATH'], 'child': child.pid}), flush=True)\n"
          "time.sleep(120)\n")


class Leaver(Instance):
    def argv(self) -> list[str]:
        return [sys.executable, "-c", LEAVER]


def _started(tmp_path: Path) -> tuple[LocalProcess, dict]:
    inst = Leaver(name="rollout-0", role="rollout", config=tmp_path / "c.yaml", log=tmp_path / "rollout-0.log")
    proc = LocalProcess(inst)
    deadline = time.monotonic() + 30
    while not inst.log.read_text().strip():
        assert time.monotonic() < deadline and proc.exit_code() is None, inst.log.read_text()
        time.sleep(0.05)
    return proc, json.loads(inst.log.read_text().splitlines()[0])


@pytest.mark.parametrize("ending", ["stopped", "killed by the supervisor", "killed from outside"])
def test_an_instances_temporary_directory_goes_with_its_group(tmp_path, ending):
    proc, seen = _started(tmp_path)
    assert seen["tmp"] == seen["rpc"] == str(proc.tmp) and proc.tmp.name.startswith("dart-jax-rollout-0-")
    assert {p.name for p in proc.tmp.iterdir()} == {"vllm_dist_x", "ipc-uuid"}
    if ending == "stopped":
        proc.stop(grace_s=2)
    elif ending == "killed by the supervisor":  # a role that stopped answering its heartbeats
        proc.kill()
    else:
        signal_group(proc.pid, signal.SIGKILL)  # `kill -9 -PGID`: the supervisor sees it dead, then reaps it
        deadline = time.monotonic() + 10
        while proc.exit_code() is None:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        proc.stop()  # the supervisor's end of a role that died (Supervisor._died)
    assert not group_pids(proc.pid) and not proc.tmp.exists()
