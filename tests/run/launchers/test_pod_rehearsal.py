"""The pod rehearsal: the shipped v5p-64 config's trainer submitted to two slice hosts, each its
own network, name and Unix user, as `dart-jax run` submits it (launcher: tpu).

What is real: `SliceLauncher.start` (what `dart-jax run`'s supervisor calls for the `trainer`
row of configs/tpu/v5p-64.yaml) builds the wheel, ships it with the lock, the scripts and the
trainer's config (slice_config: the slice's own policy path), and runs every gcloud command
of submit; the `gcloud` on PATH only carries them to the hosts (gcloud_netns). Each host
(tests.hosts) has its own network namespace, address and name, resolves the head as
`dart-jax-head`, and runs as a user whose uid is its own; the shared run root starts
root-owned 0755, bind-mounted on itself (a mount point, as the share is): the install's share
step (sudo, group gid 2000, 2775) is what makes it writable. The config is the shipped file
with overrides only for what this CPU machine must change (OVERRIDES): the tiny policy, CPU
mesh and buckets, the run root, steps and checkpoints each step. The data manager is this
process, on the bridge's address at the config's port (the head); JAX CPU with two devices a
host stands in for the TPU, from TPU_WORKER_HOSTNAMES and TPU_WORKER_ID (the slice's
variables); each host's weights bind 0.0.0.0 and are announced at its name (`advertise`).
A rollout host, a third namespace, pulls every version from worker 0's address with a
rollout worker's puller (rollout_gpu.pull, the vLLM-free part of its weight sync).

The data manager holds two batches: steps 1-2 train and checkpoint, and the trainer waits.
Host 1's trainer is SIGKILLed; a second start (what the supervisor does for a dead trainer)
relaunches both hosts, which resume from the shared checkpoint of step 2 once more rollouts
arrive, train to step 4 and exit 0 (the exit codes on the shared root). The last version the
rollout host pulled is the export's bytes.
"""

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from dart_jax.config import dump, load
from dart_jax.run.launchers import remote
from dart_jax.run.launchers.local import Instance
from dart_jax.run.launchers.slice import SliceLauncher, SliceProcess
from dart_jax.run.main import prepare, with_policy
from dart_jax.run.schema import RunConfig
from dart_jax.run.supervisor import instance_configs
from dart_jax.testing.trajectories import text_trajectory
from dart_jax.wire import Client
from dart_jax.wire.messages import SubmitTrajectory
from tests.hosts import Hosts
from tests.run.launchers import gcloud_netns
from tests.train import dm_store

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    os.geteuid() != 0 or not all(map(shutil.which, ("sudo", "mount.nfs", "ip", "unshare", "runuser"))),
    reason="the rehearsal needs root (ip netns, useradd) and sudo, nfs-common, iproute2, util-linux")]
ROOT = Path(__file__).resolve().parents[3]
SHIPPED = ROOT / "configs/tpu/v5p-64.yaml"
WORKERS, STEPS = ["slice0", "slice1"], 4


def overrides(share: Path, policy: Path) -> list[str]:
    """What a CPU machine must change in the shipped config, and nothing else."""
    return [f"run.root={share}", f"tpu.shared_root.path={share}", "run.name=pod", "tpu.project=rehearsal",
            "policy.hf_dir=tiny", f"tpu.setup_command=cp -r {policy} tiny",
            "trainer.mesh.fsdp=4", "trainer.buckets.seq_lens=[128,256]", "trainer.buckets.num_slots=[64]",
            "trainer.buckets.rows=2", f"trainer.steps={STEPS}", "trainer.batch_wait_s=600",
            "trainer.checkpoint.every_steps=1", "trainer.checkpoint.async_save=false"]


def _slice_env(hosts: Hosts, worker: int) -> dict:
    """What a slice gives each worker (its variables), and what the offline install reuses."""
    return {"TPU_WORKER_HOSTNAMES": ",".join(hosts[w].name for w in WORKERS), "TPU_WORKER_ID": str(worker),
            "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
            "DART_PYTHON": sys.executable, "DART_DEPS_FROM": sysconfig.get_paths()["purelib"], "UV_OFFLINE": "1",
            "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"}


PULL = """
import asyncio, hashlib, json, signal, sys
from dart_jax.config import load
from dart_jax.run.schema import RunConfig
from dart_jax.wire import RemoteError, WireTimeout
from dart_jax.wire.messages import WeightAnnounce
from dart_jax.wire.pubsub import Subscriber
from dart_jax.wire.weights import WeightTransferError
from rollout_gpu.pull import Puller

weights, pulled, stop = load(RunConfig, sys.argv[1]).weights, {}, []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))

async def follow():
    sub = Subscriber(weights.announce)
    while not stop:
        ann = await sub.receive(timeout_s=0.2)
        if isinstance(ann, WeightAnnounce) and ann.version not in pulled:
            try:
                with Puller(ann, weights.serve, timeout_s=weights.pull_timeout_s) as pull:
                    pulled[ann.version] = {i.name: hashlib.sha256(bytes(d)).hexdigest() for i, d in pull}
            except (WireTimeout, RemoteError, WeightTransferError) as e:  # the trainer finished meanwhile
                print(f"version {ann.version} not pulled: {e}", file=sys.stderr)
    sub.close()

asyncio.run(follow())
print(json.dumps(pulled))
"""


def _puller(hosts: Hosts, cfg: RunConfig, worker0: str) -> subprocess.Popen:
    """The rollout host's weight sync (a rollout worker's subscriber and puller, no engine),
    configured as `dart-jax run` configures a rollout worker (instance_configs: the weights at
    worker 0's address, from gcloud); it prints every version's tensor digests when stopped."""
    rollout = instance_configs(cfg, "rollout", 1, {cfg.weights.announce.endpoint: worker0,
                                                    cfg.weights.serve.endpoint: worker0})[0]
    path = hosts["rollout"].home / "rollout.yaml"
    path.write_text(dump(rollout))
    return subprocess.Popen(hosts.argv("rollout", [sys.executable, "-c", PULL, str(path)],
                                       env={"PYTHONPATH": str(ROOT)}), stdout=subprocess.PIPE, text=True)


def _trainers(hosts: Hosts) -> list[int]:
    pids = [int((hosts[w].home / "dart-jax" / remote.PID).read_text()) for w in WORKERS]
    return [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def _committed(run: Path) -> list[int]:
    ckpts = run / "checkpoints"
    return sorted(int(p.name) for p in ckpts.iterdir() if p.name.isdigit()) if ckpts.is_dir() else []


def _logs(hosts: Hosts) -> str:
    return "\n".join((hosts[w].home / "dart-jax" / remote.LOG).read_text()[-2500:] for w in WORKERS
                     if (hosts[w].home / "dart-jax" / remote.LOG).exists())


def _wait(what: str, done, timeout_s: float, hosts: Hosts) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} in {timeout_s:.0f} s:\n{_logs(hosts)}")
        time.sleep(0.5)


def _submit(wire, first: int, n: int) -> None:
    rng = np.random.default_rng(first)
    with Client(wire) as client:
        for i in range(first, first + n):
            client.request(SubmitTrajectory(trajectory=text_trajectory(
                rng, f"r{i}", f"t{i % 2}", float(i % 3 == 0), prompt_len=(20, 120), response_len=(4, 30))), timeout_s=60)


def _digests(path: Path, dtype: str) -> dict[str, str]:
    import jax.numpy as jnp
    from safetensors import safe_open
    with safe_open(path, framework="flax") as f:
        return {n: hashlib.sha256(np.asarray(f.get_tensor(n).astype(jnp.dtype(dtype))).tobytes()).hexdigest()
                for n in f.keys()}


@pytest.fixture
def share(tmp_path):
    """A fresh share: root's, 0755, a mount point (and the group the share step makes, removed after)."""
    group = subprocess.run(["getent", "group", "2000"], capture_output=True).returncode == 0
    path = Path(f"/tmp/dart-jax-rehearsal-{os.getpid()}")
    path.mkdir(mode=0o755)
    subprocess.run(["mount", "--bind", str(path), str(path)], check=True)
    yield path
    subprocess.run(["umount", "--lazy", str(path)])
    subprocess.run(["rm", "-rf", str(path)])
    if not group:
        subprocess.run(["groupdel", "dart-jax"], capture_output=True)


def test_shipped_v5p_config_trains_on_two_namespaced_hosts_and_resumes_after_a_host_dies(
        tmp_path, tiny_dir, share, monkeypatch):
    policy = Path(f"{share}-policy")  # where the slice's setup_command fetches it from (readable by all)
    subprocess.run(["cp", "-r", str(tiny_dir), str(policy)], check=True)
    subprocess.run(["chmod", "-R", "a+rX", str(policy)], check=True)
    with Hosts.up([*WORKERS, "rollout"]) as hosts:
        try:
            _rehearse(tmp_path, hosts, share, policy, monkeypatch)
        finally:
            subprocess.run(["rm", "-rf", str(policy)])


def _rehearse(tmp_path: Path, hosts: Hosts, share: Path, policy: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # submit writes what travels under .dart-jax/ here; the head's policy is here
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # the head's own disk: the data manager's store
    subprocess.run(["cp", "-r", str(policy), str(tmp_path / "tiny")], check=True)
    cfg = load(RunConfig, SHIPPED, overrides(share, policy)).seeded()
    assert cfg.data.wire.endpoint == "tcp://dart-jax-head:5557"  # the shipped address, resolved by every host
    # the head joins the share's group by hand (docs/cluster.md), with the install's own share step
    subprocess.run(["bash", "-c", remote.share_access(cfg.tpu.shared_root)], check=True)
    run_dir, head_policy = prepare(cfg)  # `dart-jax run`'s start: the run directory, the task file, the policy
    store = tmp_path / "store"
    dm_store.fill(store, n=16)  # two batches of 2 tasks x groups of 4
    wire = dict(endpoint=f"tcp://{hosts.head}:5557", allow_remote=True)
    dm, stop_dm = dm_store.serve_copy(store, tmp_path / "dm", type(cfg.data.wire)(**wire))
    trainer_yaml = run_dir.root / "roles" / "trainer.yaml"  # the head's config: its own absolute policy path
    trainer_yaml.parent.mkdir(exist_ok=True)
    trainer_yaml.write_text(dump(with_policy(cfg, head_policy)))
    instance = Instance("trainer", "trainer", trainer_yaml, tmp_path / "trainer.log")
    gcloud_netns.install(tmp_path / "bin", hosts, WORKERS, [_slice_env(hosts, i) for i in range(len(WORKERS))])
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    launcher, run = SliceLauncher(cfg), run_dir.root
    worker0 = SliceProcess(cfg, launcher.env).host()
    assert worker0 == hosts[WORKERS[0]].address
    puller = _puller(hosts, cfg, worker0)
    try:
        proc = launcher.start(instance)
        _wait("checkpoint of step 2", lambda: 2 in _committed(run) or proc.exited(), 600, hosts)
        assert not proc.exited() and _committed(run) == [1, 2]  # the third batch has not come
        os.kill(_trainers(hosts)[1], signal.SIGKILL)  # host 1 dies
        proc = launcher.start(instance)  # what the supervisor does for a dead trainer: submit again
        _submit(dm.wire, 100, 16)  # two more batches
        _wait("both trainers' exit", lambda: not _trainers(hosts), 600, hosts)
        _wait("both exit codes on the shared root", lambda: len(proc.exited()) == len(WORKERS), 5, hosts)
        assert proc.exited() == {f"{hosts[w].name}-home-{hosts[w].name}-dart-jax": 0 for w in WORKERS}, _logs(hosts)
    finally:
        launcher.env.runner(["gcloud", "compute", "tpus", "tpu-vm", "ssh", cfg.tpu.name, "--worker=all",
                             f"--command=bash {cfg.tpu.workdir}/{remote.LAUNCH} stop"], False)
        puller.send_signal(signal.SIGTERM)
        pulled = json.loads(puller.communicate(timeout=60)[0] or "{}")
        stop_dm.set()

    assert _committed(run)[-1] == STEPS
    log = (run / "logs" / "trainer.log").read_text()
    assert log.count("resumed at step 2") == len(WORKERS), log[-3000:]  # both hosts, from the shared checkpoint
    for w in WORKERS:  # every host ran as its own user, not the head's, and wrote to the share through the group
        assert hosts[w].uid not in (0, os.getuid())
    assert (share.stat().st_mode & 0o7777, share.stat().st_gid) == (0o2775, cfg.tpu.shared_root.gid)
    assert len(pulled) >= 3, sorted(pulled)  # versions before the kill and after the resume
    last = pulled[max(pulled, key=int)]  # what travels is the export in the weights' dtype
    assert last == _digests(run / "export" / f"step-{STEPS}" / "model.safetensors", cfg.weights.dtype)
