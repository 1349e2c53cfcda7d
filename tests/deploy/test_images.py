"""The CPU role images, built (scripts/build_images.sh, `make images`) and run with podman:
each role's smoke command as the image's user, its run directory on a volume that is root's
on the host, as a fresh persistent volume is.

The non-root images (core, envs: user `dart`, uid 1000) need that volume writable by their
group, which Kubernetes does with the pods' `fsGroup: 1000` (deploy/k8s): the kubelet gives the
volume's root to the group with the setgid bit. Here the test does the same to the directory
before mounting it, and shows first that the data manager refuses to start without it. The TPU
trainer's image runs as root (libtpu opens the TPU devices), so its volume stays as it is.
docs/images.md has the build times and sizes.
"""

import asyncio
import json
import os
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Callable

import pytest
import yaml

from dart_jax.agent.config import PromptConfig
from dart_jax.agent.prompt import PromptBuilder
from dart_jax.testing.trajectories import trajectory
from dart_jax.wire import Client, WireConfig, WireTimeout
from dart_jax.wire.env_client import EnvClient
from dart_jax.wire.messages import EnvReply, Ping, Pong, TaskSpec
from dart_jax.wire.trajfiles import write_trajectories
from tests.net import free_port

pytestmark = [pytest.mark.slow, pytest.mark.images]

ROOT = Path(__file__).resolve().parents[2]
IMAGE_DIR = Path(os.environ.get("DART_IMAGE_DIR") or Path(os.environ.get("XDG_CACHE_HOME") or
                                                           Path.home() / ".cache") / "dart-jax/images")
# JAX's compilation cache for the TPU image's smoke, kept between runs on this host as a node's
# cache volume is: a warm run loads the tiny model's compiled step instead of compiling it again
# (cache entries are keyed on the HLO and JAX's version, so a changed step compiles afresh);
# bounded, least recently used entries evicted.
JAX_CACHE = IMAGE_DIR / "jax-cache"
JAX_CACHE_ENV = {"JAX_COMPILATION_CACHE_DIR": "/cache/jax", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
                 "JAX_COMPILATION_CACHE_MAX_SIZE": str(64 << 20)}
TASKS = ROOT / "deploy/k8s/tasks.jsonl"
FS_GROUP = 1000  # the pods' fsGroup and the image user's group


@pytest.fixture(scope="module")
def images() -> dict[str, dict]:
    """role -> its manifest (image tag, podman flags this host needs), built when out of date."""
    out = subprocess.run(["bash", "scripts/build_images.sh"], cwd=ROOT, capture_output=True, text=True,
                         timeout=3600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    manifests = {p.name.rsplit("-", 1)[0]: json.loads(p.read_text()) for p in IMAGE_DIR.glob("*-*.json")}
    assert {"core", "envs", "trainer-tpu"} <= set(manifests), manifests
    return manifests


def podman(image: dict, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """`podman run` with this host's flags (image["podman"], image["run"]); `args`: run's options,
    the image, the command."""
    cmd = ["podman", *image["podman"], "run", *image["run"], *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def volume(path: Path, *, fs_group: bool) -> Path:
    """A fresh directory as a new volume is: root's, 0755; with `fs_group`, as the kubelet leaves
    it for a pod with fsGroup: its group the pod's, group-writable, setgid."""
    path.mkdir()
    os.chown(path, 0, FS_GROUP if fs_group else 0)
    path.chmod(0o2775 if fs_group else 0o755)
    return path


def config(tmp: Path, cfg: dict) -> Path:
    """A run config in its own directory (mounted read-only at /etc/dart-jax/config)."""
    folder = tmp / "config"
    folder.mkdir()
    (folder / "run.yaml").write_text(yaml.safe_dump({"run": {"root": "/runs", "name": "smoke"}, **cfg}))
    return folder


def pong(endpoint: str, deadline_s: float) -> Pong:
    """The server's answer to Ping, asked again until it comes or `deadline_s` passes."""
    end = time.monotonic() + deadline_s
    while True:
        try:
            with Client(WireConfig(endpoint=endpoint, timeout_s=2.0)) as client:
                return client.request(Ping())
        except WireTimeout:
            if time.monotonic() > end:
                raise
            time.sleep(0.5)


def serve(image: dict, name: str, runs: Path, conf: Path, command: list[str], endpoint: str, role: str,
          then: Callable[[], None] = lambda: None):
    """Starts a role's server in `image` on the host's network, pings it from here, calls `then`
    while it serves, stops it."""
    started = podman(image, "-d", "--name", name, "--network", "host", "-v", f"{runs}:/runs",
                     "-v", f"{conf}:/etc/dart-jax/config:ro", image["image"], *command)
    assert started.returncode == 0, started.stderr
    try:
        try:
            assert pong(endpoint, 120).role == role
        except WireTimeout:
            logs = subprocess.run(["podman", *image["podman"], "logs", name], capture_output=True, text=True)
            raise AssertionError(f"{role} did not answer: {logs.stdout[-2000:]}{logs.stderr[-3000:]}")
        then()
        stopped = subprocess.run(["podman", *image["podman"], "stop", "-t", "20", name], capture_output=True,
                                 text=True, timeout=60)
        assert stopped.returncode == 0, stopped.stderr
        waited = subprocess.run(["podman", *image["podman"], "wait", name], capture_output=True, text=True,
                                timeout=60)
        assert waited.stdout.strip() == "0", f"{role} did not stop cleanly on SIGTERM: {waited.stdout}{waited.stderr}"
    finally:
        subprocess.run(["podman", *image["podman"], "rm", "-f", name], capture_output=True, timeout=60)


def test_data_manager_writes_its_store_as_dart_on_a_root_owned_volume(images, tmp_path):
    core = images["core"]
    conf = config(tmp_path, {"data": {"tasks": {"task_file": "/etc/dart-jax/config/tasks.jsonl"}}})
    (conf / "tasks.jsonl").write_text(TASKS.read_text())
    bare = volume(tmp_path / "bare", fs_group=False)
    refused = podman(core, "--rm", "--network", "none", "-v", f"{bare}:/runs",
                     "-v", f"{conf}:/etc/dart-jax/config:ro", core["image"],
                     "dart-jax", "data-manager", "/etc/dart-jax/config/run.yaml")
    assert refused.returncode != 0 and "Permission denied" in refused.stderr, refused.stderr[-2000:]

    runs, port = volume(tmp_path / "runs", fs_group=True), free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    serve(core, f"dart-jax-test-dm-{port}", runs, conf,
          ["dart-jax", "data-manager", "/etc/dart-jax/config/run.yaml", f"data.wire.endpoint={endpoint}"],
          endpoint, "data-manager")
    db = runs / "smoke/data/store.sqlite"
    assert db.stat().st_uid == 1000 and db.stat().st_gid == FS_GROUP
    with sqlite3.connect(db) as store:
        assert store.execute("SELECT count(*) FROM tasks").fetchone()[0] == len(TASKS.read_text().splitlines())


async def miniwob_reset(endpoint: str) -> EnvReply:
    """A MiniWoB++ episode's first screen (Chromium in the container, as its user)."""
    client = EnvClient(WireConfig(endpoint=endpoint), "test-images")
    try:
        async with await client.acquire("miniwob") as env:
            return await env.reset(TaskSpec(task_id="miniwob/click-test/0", backend="miniwob", name="click-test"))
    finally:
        await client.aclose()


def test_env_server_answers_a_ping_and_resets_miniwob_over_the_wire(images, tmp_path):
    envs = images["envs"]
    runs, port = volume(tmp_path / "runs", fs_group=True), free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    conf = config(tmp_path, {"envs": {"slots": [{"type": "miniwob", "count": 1}]}})
    replies = []
    serve(envs, f"dart-jax-test-env-{port}", runs, conf,
          ["dart-jax", "env-server", "/etc/dart-jax/config/run.yaml", f"envs.wire.endpoint={endpoint}"],
          endpoint, "env-server", then=lambda: replies.append(asyncio.run(miniwob_reset(endpoint))))
    assert replies[0].status == "ok" and replies[0].observation.screenshot.startswith(b"\x89PNG")


def test_tpu_trainer_on_jax_cpu_trains_and_checkpoints(images, tmp_path, tiny_dir):
    tpu = images["trainer-tpu"]
    builder = PromptBuilder.from_pretrained(tiny_dir, PromptConfig(max_images=2))
    demos = tmp_path / "demos"
    write_trajectories(demos, [trajectory(builder, "a", "t0", steps=2), trajectory(builder, "b", "t1", steps=2)],
                       "traj")
    conf = config(tmp_path, {
        "policy": {"hf_dir": "/policy"},
        "trainer": {"mode": "sft", "steps": 2, "sft_data": "/demos", "export": False, "optimizer": {"lr": 1e-3},
                    "checkpoint": {"every_steps": 2, "keep": 1},
                    "buckets": {"seq_lens": [768], "num_slots": [768], "rows": 2}},
    })
    runs = volume(tmp_path / "runs", fs_group=False)
    JAX_CACHE.mkdir(parents=True, exist_ok=True)
    cache_env = [arg for name, value in JAX_CACHE_ENV.items() for arg in ("-e", f"{name}={value}")]
    out = podman(tpu, "--rm", "--network", "none", "-e", "JAX_PLATFORMS=cpu", *cache_env, "-v", f"{JAX_CACHE}:/cache/jax",
                 "-v", f"{runs}:/runs",
                 "-v", f"{conf}:/etc/dart-jax/config:ro", "-v", f"{tiny_dir}:/policy:ro", "-v", f"{demos}:/demos:ro",
                 tpu["image"], "dart-jax", "train", "/etc/dart-jax/config/run.yaml")
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.splitlines()[-1])["step"] == 2
    assert [p.name for p in (runs / "smoke/checkpoints").iterdir() if p.name.isdigit()] == ["2"]
