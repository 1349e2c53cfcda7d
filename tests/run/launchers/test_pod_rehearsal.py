"""The pod rehearsal: what `dart-jax tpu submit` does on a slice, for two local "hosts".

`remote.ship` builds the wheel of this checkout and writes the run config, the lock and the
install and launch scripts, exactly as submit does; each host gets a copy in a fresh
directory (as scp gives it) and runs `bash install.sh` and `bash launch.sh start` there. The
install is the offline form of the same script (DART_PYTHON: this interpreter; DART_DEPS_FROM:
this venv's site-packages, so only the wheel installs, --no-deps; UV_OFFLINE): the hosts run
the shipped code and its entry point, not this checkout. JAX CPU stands in for the TPU:
each host has two CPU devices, and `trainer.distributed.mode: auto` forms one group of two
processes from TPU_WORKER_HOSTNAMES and TPU_WORKER_ID, the variables a GKE slice gives.
Checkpoints and metrics go to one shared run root. Process 0 publishes each version to a
weight puller (a rollout worker's side of the sync).

The data manager holds two batches: the pod trains steps 1-2, checkpoints each, and waits for
a third. Host 1's trainer is SIGKILLed; `launch.sh start` on both hosts (what a second submit
runs) stops host 0's trainer, and both resume from the shared checkpoint of step 2 once more
rollouts arrive, train to step 4 and exit. Both launches compile the train step: most of the
test's time (161 s on this 2-core machine lightly shared; 572 s at a load average of 50-70).
"""

import os
import shutil
import signal
import json
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from dart_jax.config import dump
from dart_jax.run.schema import RunConfig
from dart_jax.run.config import PolicySection, RunSection
from dart_jax.run.launchers import remote
from dart_jax.run.launchers.config import TPUConfig
from dart_jax.testing.trajectories import text_trajectory
from dart_jax.train.config import BucketConfig, CheckpointConfig, DistributedConfig, MeshConfig
from dart_jax.train.config import OptimizerConfig, TrainerConfig
from dart_jax.wire import Client, WireConfig
from dart_jax.wire.messages import SubmitTrajectory
from dart_jax.wire.config import WeightSyncConfig
from tests.net import free_port
from tests.train import dm_store
from tests.follow import Follower

pytestmark = pytest.mark.slow
HOSTS, STEPS = 2, 4


def _config(tmp_path: Path, dm, tiny_dir) -> RunConfig:
    sock = lambda k: WireConfig(endpoint=f"ipc://{tmp_path}/{k}.sock")  # noqa: E731
    return RunConfig(
        run=RunSection(name="pod", root=str(tmp_path / "shared")), policy=PolicySection(hf_dir=str(tiny_dir)),
        data=dm, weights=WeightSyncConfig(announce=sock("announce"), serve=sock("weights"), reannounce_s=0.2),
        trainer=TrainerConfig(mode="rl", optimizer=OptimizerConfig(lr=1e-3), mesh=MeshConfig(fsdp=4),
                              buckets=BucketConfig((128, 256), (64,), 2),
                              checkpoint=CheckpointConfig(every_steps=1, async_save=False),
                              steps=STEPS, batch_wait_s=600, distributed=DistributedConfig(mode="auto")))


def _run(argv: list[str], cwd: Path, env: dict) -> None:
    out = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, (argv, out.stdout[-3000:], out.stderr[-3000:])


def _host_env(worker: int, port: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return env | {"DART_PYTHON": sys.executable,
                  "PATH": f"{Path(sys.executable).parent}:{env['PATH']}",  # uv is there, beside it
                  "DART_DEPS_FROM": sysconfig.get_paths()["purelib"], "UV_OFFLINE": "1",
                  "TPU_WORKER_HOSTNAMES": ",".join(["127.0.0.1"] * HOSTS), "TPU_WORKER_ID": str(worker),
                  "JAX_COORDINATOR_PORT": str(port), "JAX_PLATFORMS": "cpu",
                  "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}


def _trainer(host: Path) -> psutil.Process | None:
    pid_file = host / remote.PID
    try:
        return psutil.Process(int(pid_file.read_text()))
    except (FileNotFoundError, psutil.NoSuchProcess):
        return None


def _gone(p: psutil.Process) -> bool:
    """Ended (a zombie too: an orphan waits for the machine's init to reap it)."""
    try:
        return not p.is_running() or p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait(what: str, done, timeout_s: float, hosts: list[Path], dead=lambda: False) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline or dead():
            logs = "\n".join((h / remote.LOG).read_text()[-2000:] for h in hosts if (h / remote.LOG).exists())
            pytest.fail(f"no {what} in {timeout_s:.0f} s:\n{logs}")
        time.sleep(0.5)


def _committed(run: Path) -> list[int]:
    ckpts = run / "checkpoints"
    return sorted(int(p.name) for p in ckpts.iterdir() if p.name.isdigit()) if ckpts.is_dir() else []


def _submit(dm: WireConfig, first: int, n: int) -> None:
    rng = np.random.default_rng(first)
    with Client(dm) as client:
        for i in range(first, first + n):
            client.request(SubmitTrajectory(trajectory=text_trajectory(
                rng, f"r{i}", f"t{i % 2}", float(i % 3 == 0), prompt_len=(20, 120), response_len=(4, 30))), timeout_s=60)


def test_two_hosts_install_the_wheel_train_as_one_pod_and_resume_from_the_shared_checkpoint(tmp_path, tiny_dir):
    store = tmp_path / "store"
    dm_store.fill(store, n=16)  # two batches of 2 tasks x groups of 4
    dm, stop_dm = dm_store.serve_copy(store, tmp_path / "dm")
    cfg = _config(tmp_path, dm, tiny_dir)
    shipped = remote.ship(TPUConfig(), tmp_path / "ship", dump(cfg),
                          lambda argv: subprocess.run(argv, capture_output=True).returncode)
    hosts = [tmp_path / f"host{i}" / "dart-jax" for i in range(HOSTS)]
    port = free_port()
    envs = [_host_env(i, port) for i in range(HOSTS)]
    follower = Follower(cfg.weights)
    try:
        for host, env in zip(hosts, envs):
            host.mkdir(parents=True)
            for f in shipped.files:  # what scp copies to every worker
                shutil.copytree(f, host / f.name) if f.is_dir() else (host / f.name).write_bytes(f.read_bytes())
            _run(["bash", remote.INSTALL], host, env)
            origin = subprocess.run([".venv/bin/python", "-c", "import dart_jax; print(dart_jax.__file__)"],
                                    cwd=host, env=env, capture_output=True, text=True).stdout
            assert origin.startswith(str(host / ".venv")), origin  # the shipped wheel, not this checkout
        for host, env in zip(hosts, envs):
            _run(["bash", remote.LAUNCH, "start"], host, env)
        run = tmp_path / "shared" / "pod"
        _wait("checkpoint of step 2", lambda: 2 in _committed(run), 600, hosts,
              dead=lambda: not all(_trainer(h) for h in hosts))
        first = [_trainer(h) for h in hosts]
        assert all(first) and _committed(run) == [1, 2]  # the third batch has not come

        os.kill(first[1].pid, signal.SIGKILL)  # host 1 dies
        _run(["bash", remote.LAUNCH, "start"], hosts[0], envs[0])  # a second submit relaunches every host
        _run(["bash", remote.LAUNCH, "start"], hosts[1], envs[1])
        assert _gone(first[0])  # launch.sh stopped host 0's old trainer first
        second = [_trainer(h) for h in hosts]
        _submit(dm.wire, 100, 16)  # two more batches
        _wait("both trainers' exit", lambda: all(_gone(p) for p in second), 600, hosts)
    finally:
        for host, env in zip(hosts, envs):
            if (host / remote.LAUNCH).exists():
                subprocess.run(["bash", remote.LAUNCH, "stop"], cwd=host, env=env, timeout=60)
        follower.stop.set()
        follower.thread.join(10)
        stop_dm.set()

    assert _committed(run)[-1] == STEPS
    log = (run / "logs" / "trainer.log").read_text()
    assert log.count("resumed at step 2") == HOSTS, log[-3000:]  # both hosts, from the shared checkpoint
    for host in hosts:  # every host's `dart-jax train` ended with its summary: step 4
        assert json.loads((host / remote.LOG).read_text().splitlines()[-1])["step"] == STEPS
    # process 0's metrics, on the shared root. (Step 2's line was still pending when host 0 was
    # stopped: the loop writes a step's metrics when it dispatches the next.)
    steps = [r["step"] for r in dm_store.records(run) if "loss/total" in r]
    assert steps[0] == 1 and steps[-2:] == [3, 4], steps
    assert (run / "export" / f"step-{STEPS}" / "model.safetensors").is_file()
    assert len(follower.versions) >= 3  # versions before the kill and after the resume reached the worker
