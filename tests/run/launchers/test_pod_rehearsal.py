"""The pod rehearsal: `dart-jax run configs/tpu/v5p-64.yaml` on a head of its own, the trainer
submitted to two slice hosts (launcher: tpu), each host its own network, name and Unix user.

What is real: the head (tests.hosts) is a network namespace with its own address, name and
user, which every host resolves as `dart-jax-head`; there, as that user, from its own copy of
this checkout, `dart-jax run` runs the config's placement: the data manager (its store on the
head's disk), an env server (synthetic suites), a rollout worker with a vLLM CPU engine, and
the trainer submitted by `SliceLauncher` (the wheel of the head's checkout, its lock, the
scripts, the trainer's config with the slice's own policy path) through every gcloud command
of submit; the `gcloud` on PATH only carries them to the slice hosts (gcloud_netns: ssh/scp
into their namespaces as their users). The shared run root starts root-owned 0755,
bind-mounted on itself (a mount point, as the share is): the head's first `dart-jax run`
refuses it on one line naming the share step, the head runs that command (sudo) and the
second run goes; each slice host's install runs the same step (group gid 2000, 2775). JAX CPU
with two devices a host stands in for the TPU, from TPU_WORKER_HOSTNAMES and TPU_WORKER_ID
(the slice's variables); each host's weights bind 0.0.0.0 and are announced at its name
(`advertise`). A rollout host, a third namespace, pulls every version from worker 0's address
with a rollout worker's puller (rollout_gpu.pull), recording each version's bytes.

The config is the shipped file with overrides only for what this CPU machine must change
(overrides): the tiny policy and what the vLLM CPU engine and JAX CPU take (e2e's sizes), a
demos phase first (the tiny policy never succeeds on its own; UI-TARS does), two small
synthetic suites, the run root, 4 steps and a checkpoint every step. Once step 2's checkpoint
is on the share, host 1's trainer is SIGKILLed: its exit code on the shared root tells the
supervisor within seconds, which submits the trainer again; both hosts resume from that
checkpoint, train to step 4 and exit 0; the run ends with the queued resource deleted. The
worker loaded at least 3 versions, every one the rollout host pulled too, and the last version
pulled is the export's bytes.
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
from dart_jax.run.schema import RunConfig
from dart_jax.run.supervisor import instance_configs
from tests.hosts import Hosts
from tests.run.launchers import gcloud_netns

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.hosts]
ROOT = Path(__file__).resolve().parents[3]
SHIPPED = "configs/tpu/v5p-64.yaml"
WORKERS, STEPS = ["slice0", "slice1"], 4
LIMIT_S = 900  # the run's whole time: 310 s here at a load of 2-7 on 2 cores, 410 s at 5-11
# JAX's compilation cache of the slice hosts, kept between runs on this machine as a slice's
# cache on its share is between jobs (tests/deploy/test_images.py keeps the image smoke's so): a
# warm run loads the first step's executables instead of compiling them on both hosts (entries
# are keyed on the HLO and JAX's version: a changed step compiles afresh); bounded, least
# recently used entries evicted. Root's, the share's group (the hosts' users write it), 2775.
JAX_CACHE = Path("/var/cache/dart-jax-rehearsal-jax")


def overrides(share: Path, policy: Path) -> list[str]:
    """What a CPU machine must change in the shipped config, and nothing else."""
    return [f"run.root={share}", f"tpu.shared_root.path={share}", "run.name=pod", "tpu.project=rehearsal",
            "policy.hf_dir=tiny", f"tpu.setup_command=cp -r {policy} tiny", "run.phases=[demos, rl]",
            "tasks.suites=[{backend: synthetic, names: [click-button, enter-text], train_seeds: 3, eval_seeds: 1}]",
            "data.curation.tasks_per_batch=2", "data.curation.group_size=4", "data.curation.max_rollouts=4", "data.curation.default_max_steps=3",
            "data.curation.max_steps=3", "rollout.episodes=4", "rollout.sampling.max_tokens=24",
            "rollout.engine.max_model_len=4096", "trainer.mesh.fsdp=4", "trainer.buckets.seq_lens=[2048]",
            "trainer.buckets.num_slots=[4096]", "trainer.buckets.rows=2", f"trainer.steps={STEPS}",
            "trainer.batch_wait_s=600", "trainer.checkpoint.every_steps=1", "trainer.checkpoint.async_save=false"]


def _slice_env(hosts: Hosts, worker: int) -> dict:
    """What a slice gives each worker (its variables), what the offline install reuses, and
    JAX's compilation cache (process 0 writes it, every host reads it: the resumed trainer loads
    what the first launch compiled, a warm run what an earlier run did)."""
    return {"JAX_COMPILATION_CACHE_DIR": str(JAX_CACHE), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
            "JAX_COMPILATION_CACHE_MAX_SIZE": str(64 << 20),
            "TPU_WORKER_HOSTNAMES": ",".join(hosts[w].name for w in WORKERS), "TPU_WORKER_ID": str(worker),
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


def _puller(hosts: Hosts, cfg: RunConfig) -> subprocess.Popen:
    """The rollout host's weight sync (a rollout worker's subscriber and puller, no engine),
    configured as `dart-jax run` configures a rollout worker (instance_configs: the weights at
    worker 0's address); it prints every version's tensor digests when stopped."""
    worker0 = hosts[WORKERS[0]].address
    rollout = instance_configs(cfg, "rollout", 1, {cfg.weights.announce.endpoint: worker0,
                                                    cfg.weights.serve.endpoint: worker0})[0]
    path = hosts["rollout"].home / "rollout.yaml"
    path.write_text(dump(rollout))
    return subprocess.Popen(hosts.argv("rollout", [sys.executable, "-c", PULL, str(path)],
                                       env={"PYTHONPATH": str(ROOT)}), stdout=subprocess.PIPE, text=True)


def _checkout(dest: Path, user: str) -> None:
    """The head's own copy of this checkout (what `submit` builds its wheel from), its user's."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                           capture_output=True).stdout.decode().split("\0")
    dest.mkdir()
    for name in filter(None, files):
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    subprocess.run(["chown", "-R", f"{user}:{user}", str(dest)], check=True)


def _trainers(hosts: Hosts) -> list[int]:
    pids = []
    for w in WORKERS:
        path = hosts[w].home / "dart-jax" / remote.PID
        pid = int(path.read_text()) if path.exists() else 0
        if pid and psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
            pids.append(pid)
    return pids


def _trainer_of(launch: int) -> int:
    """The trainer process (`dart-jax train`) under the launch's wrapper (launch.sh: setsid bash -c)."""
    return next(p.pid for p in psutil.Process(launch).children() if "train" in p.cmdline())


def _committed(run: Path) -> list[int]:
    ckpts = run / "checkpoints"
    return sorted(int(p.name) for p in ckpts.iterdir() if p.name.isdigit()) if ckpts.is_dir() else []


def _logs(hosts: Hosts, head_out: Path, run: Path) -> str:
    """The slices' logs, the head's roles' own logs (the share is removed after the test) and
    `dart-jax run`'s stderr: what a failure shows."""
    logs = [hosts[w].home / "dart-jax" / remote.LOG for w in WORKERS]
    roles = sorted((run / "logs").glob("*.out.log")) if (run / "logs").is_dir() else []
    return "\n".join(f"== {p}\n{p.read_text(errors='replace')[-2500:]}" for p in [*logs, *roles, head_out] if p.exists())


def _digests(path: Path, dtype: str) -> dict[str, str]:
    import jax.numpy as jnp
    from safetensors import safe_open
    with safe_open(path, framework="flax") as f:
        return {n: hashlib.sha256(np.asarray(f.get_tensor(n).astype(jnp.dtype(dtype))).tobytes()).hexdigest()
                for n in f.keys()}


@pytest.fixture
def share():
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


def test_dart_jax_run_of_the_shipped_v5p_config_from_a_head_namespace_survives_a_dead_slice_host(
        tmp_path, tiny_dir, share):
    policy = Path(f"{share}-policy")  # where the slice's setup_command fetches it from (readable by all)
    subprocess.run(["cp", "-r", str(tiny_dir), str(policy)], check=True)
    subprocess.run(["chmod", "-R", "a+rX", str(policy)], check=True)
    with Hosts.up(["head", *WORKERS, "rollout"], head="head") as hosts:
        try:
            _rehearse(tmp_path, hosts, share, policy)
        finally:
            subprocess.run(["rm", "-rf", str(policy)])


def _rehearse(tmp_path: Path, hosts: Hosts, share: Path, policy: Path) -> None:
    head = hosts["head"]
    checkout, bin_dir = head.home / "checkout", head.home / "bin"
    _checkout(checkout, head.name)
    subprocess.run(["cp", "-r", str(policy), str(checkout / "tiny")], check=True)  # the head's own policy
    subprocess.run(["chown", "-R", f"{head.name}:{head.name}", str(checkout / "tiny")], check=True)
    cfg = load(RunConfig, ROOT / SHIPPED, overrides(share, policy)).seeded()
    JAX_CACHE.mkdir(exist_ok=True)
    os.chown(JAX_CACHE, 0, cfg.tpu.shared_root.gid)
    JAX_CACHE.chmod(0o2775)
    gcloud_netns.install(bin_dir, hosts, WORKERS, [_slice_env(hosts, i) for i in range(len(WORKERS))])
    assert cfg.data.wire.endpoint == "tcp://dart-jax-head:5557"  # the shipped address, resolved by every host
    env = {"PYTHONPATH": str(checkout), "PATH": f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin:/usr/sbin:/sbin"}

    def on_head(argv: list[str]) -> list[str]:
        return hosts.argv("head", ["bash", "-c", f'cd {checkout} && exec "$@"', "run", *argv], env=env)

    run_argv = on_head([sys.executable, "-m", "dart_jax.cli", "run", SHIPPED, *overrides(share, policy)])
    # a fresh share: the head's user cannot make the run directory; one line names the fix
    first = subprocess.run(run_argv, capture_output=True, text=True, timeout=300)
    assert first.returncode == 2 and first.stderr.count("\n") == 1, first.stderr[-3000:]
    assert f"the shared root {share} is not writable by {head.name}" in first.stderr, first.stderr
    fix = first.stderr.split("`")[1]
    assert fix == remote.share_command(cfg.tpu.shared_root)
    subprocess.run(on_head(["bash", "-euo", "pipefail", "-c", fix]), check=True, timeout=60)

    out, err = tmp_path / "run.out", head.home / "run.err"
    puller = _puller(hosts, cfg)
    run = share / cfg.run.name
    start = time.monotonic()
    with open(out, "w") as stdout, open(err, "w") as stderr:
        proc = subprocess.Popen(run_argv, stdout=stdout, stderr=stderr)  # a new login: the group counts
    try:
        while not (2 in _committed(run) and len(_trainers(hosts)) == len(WORKERS)):
            assert proc.poll() is None, _logs(hosts, err, run)
            assert time.monotonic() - start < LIMIT_S, f"no checkpoint of step 2 in {LIMIT_S} s:\n{_logs(hosts, err, run)}"
            time.sleep(0.5)
        resume_at = _committed(run)[-1]
        # host 1's trainer dies (the launch's wrapper lives to write its exit code): the supervisor submits again
        os.kill(_trainer_of(_trainers(hosts)[1]), signal.SIGKILL)
        proc.wait(timeout=LIMIT_S - (time.monotonic() - start))
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(60)
        puller.send_signal(signal.SIGTERM)
        pulled = json.loads(puller.communicate(timeout=60)[0] or "{}")
    assert proc.returncode == 0, _logs(hosts, err, run)
    summary = json.loads(out.read_text().strip().splitlines()[-1])
    assert summary["rl_steps"] == STEPS and summary["restarts"] == {"trainer": 1}, json.dumps(summary)
    assert summary["demo_successes"] > 0 and summary["pool_imported"] > 0, json.dumps(summary)
    assert (bin_dir / "released").read_text().split() == [cfg.tpu.queued_resource_id]  # nothing bills on

    # the death was seen from host 1's exit code on the shared root (137: SIGKILL), not from
    # heartbeats that stopped (a silent trainer is taken for dead, code 1, after heartbeat_timeout_s)
    assert "trainer exited with code 137; restart 1 of" in (run / "logs" / "run.log").read_text()
    log = (run / "logs" / "trainer.log").read_text()
    assert log.count(f"resumed at step {resume_at}") == len(WORKERS), log[-3000:]  # both hosts, the shared checkpoint
    exits = Path(remote.exit_dir(cfg.tpu))
    assert {f.name: f.read_text().strip() for f in exits.iterdir()} == {
        f"{hosts[w].name}-home-{hosts[w].name}-dart-jax": "0" for w in WORKERS}
    uids = [head.uid, *(hosts[w].uid for w in WORKERS)]  # every host its own user, none root
    assert 0 not in uids and len(set(uids)) == len(uids)
    assert run.stat().st_uid == head.uid  # `dart-jax run` made the run directory as the head's user
    assert (share.stat().st_mode & 0o7777, share.stat().st_gid) == (0o2775, cfg.tpu.shared_root.gid)
    # the worker on the head loaded versions the trainer on the slice served, over TCP across namespaces
    syncs = [json.loads(line) for line in (run / "metrics" / "rollout-rollout-0.jsonl").read_text().splitlines()
             if "sync_version" in line]
    loaded = {s["sync_version"] for s in syncs if s["sync_ok"]}
    assert len(loaded) >= 3 and loaded <= {int(v) for v in pulled}, (syncs, sorted(pulled))
    assert max(map(int, pulled)) == summary["policy_versions"]  # the resumed trainer published its restored state too
    last = pulled[max(pulled, key=int)]  # what travels is the export in the weights' dtype
    assert last == _digests(run / "export" / f"step-{STEPS}" / "model.safetensors", cfg.weights.dtype)
