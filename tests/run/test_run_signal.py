"""`dart-jax run` ended by SIGTERM (kill, a batch scheduler) takes every role with it: no
role process and no vLLM engine outlives the run."""

import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.procs import descendants

pytestmark = [pytest.mark.slow, pytest.mark.vllm]
ROOT = Path(__file__).resolve().parents[2]


def test_sigterm_stops_every_role_and_engine(tmp_path):
    sock = lambda name: f"ipc://{tmp_path}/{name}.sock"  # noqa: E731
    argv = [sys.executable, "-m", "dart_jax.cli", "run", "configs/rl.yaml", f"run.root={tmp_path}", "run.name=t",
            "run.view=lines", "run.phases=[rl]", f"envs.wire.endpoint={sock('envs')}", f"data.wire.endpoint={sock('dm')}",
            f"weights.announce.endpoint={sock('announce')}", f"weights.serve.endpoint={sock('weights')}",
            "envs.slots=[{type: synthetic, count: 2}]",
            "tasks.suites=[{backend: synthetic, names: [click-button], train_seeds: 2, eval_seeds: 0}]"]
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not any("VLLM" in " ".join(p.cmdline() or [p.name()]) or p.name().startswith("VLLM")
                      for p in descendants(proc.pid)):  # every role up, the worker's engine starting
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "no vLLM engine in 300 s"
            time.sleep(0.5)
        tree = descendants(proc.pid)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(120) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:  # the run did not stop: take it and its roles down
            for p in [*descendants(proc.pid), proc]:
                p.kill()
    gone, alive = psutil.wait_procs(tree, timeout=60)
    for p in alive:  # leave nothing behind for the next test, then fail
        p.kill()
    assert not alive, [p.pid for p in alive]
