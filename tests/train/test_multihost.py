"""A two-process "pod" on one machine: two `dart-jax train` processes with two CPU devices
each form one mesh through `jax.distributed` on loopback and take RL steps on curated
batches from a data manager (process 0 fetches them, both build their own rows). Losses,
the exported parameters and every published version equal those of one process with four
devices on the same data. Each host of the pod serves the blocks it holds from its own
bucket server: a worker-side puller reassembles every version from both, each host sends
exactly its share (bytes measured at both ends) and neither sends it all. The store holds
STEPS batches and both trainers ask for one more: process 0 waits `batch_wait_s` for it
and every host of the pod stops at step STEPS with it.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file

from dart_jax.config import dump
from dart_jax.run.schema import RunConfig
from dart_jax.run.config import PolicySection, RunSection
from dart_jax.train.config import BucketConfig, DistributedConfig, MeshConfig, OptimizerConfig, TrainerConfig
from dart_jax.wire import WireConfig
from dart_jax.wire.config import WeightSyncConfig
from tests.follow import Follower
from tests.net import free_port
from tests.train import dm_store

pytestmark = pytest.mark.slow
STEPS = 3  # the batches 24 rollouts make (two tasks, groups of 4, two tasks a batch)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("store")
    dm_store.fill(root, n=24)
    return root


def _config(tmp_path, name, store, tiny_dir, distributed: DistributedConfig, rows: int):
    dm, stop = dm_store.serve_copy(store, tmp_path / f"{name}-dm")
    sock = lambda k: WireConfig(endpoint=f"ipc://{tmp_path}/{name}-{k}.sock")  # noqa: E731 (host i: -i appended)
    cfg = RunConfig(run=RunSection(name=name, root=str(tmp_path)), policy=PolicySection(hf_dir=str(tiny_dir)),
                    data=dm, weights=WeightSyncConfig(announce=sock("announce"), serve=sock("weights"),
                                                      reannounce_s=0.2),
                    trainer=TrainerConfig(mode="rl", optimizer=OptimizerConfig(lr=1e-3), mesh=MeshConfig(fsdp=4),
                                          buckets=BucketConfig((128, 256), (64,), rows),
                                          # a budget it does not reach: process 0's clock is broadcast before every update
                                          steps=STEPS + 1, batch_wait_s=5, max_seconds=3600, distributed=distributed))
    path = tmp_path / f"{name}.yaml"
    path.write_text(dump(cfg))
    return cfg, path, stop


def _train(path, devices: int, process_id: int | None = None) -> subprocess.Popen:
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}", "JAX_PLATFORMS": "cpu"}
    if process_id is not None:
        env["DART_PROCESS_ID"] = str(process_id)
    return subprocess.Popen([sys.executable, "-m", "dart_jax.cli", "train", str(path)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _losses(run) -> dict[int, float]:
    lines = map(json.loads, (run / "metrics" / "trainer.jsonl").read_text().splitlines())
    return {r["step"]: r["loss/total"] for r in lines if "loss/total" in r}


def _tasks(run) -> dict[tuple[int, str], dict]:
    lines = map(json.loads, (run / "metrics" / "trainer_tasks.jsonl").read_text().splitlines())
    return {(r["step"], r["task"]): r for r in lines}


def test_two_processes_train_as_one_mesh_and_match_one_process(tmp_path, store, tiny_dir):
    # rows are per host: the same global batch of 4 rows either way, one row a device
    one, one_path, stop_one = _config(tmp_path, "one", store, tiny_dir, DistributedConfig(), rows=4)
    pod, pod_path, stop_pod = _config(tmp_path, "pod", store, tiny_dir, DistributedConfig(
        mode="explicit", coordinator=f"127.0.0.1:{free_port()}", num_processes=2), rows=2)
    pullers = [Follower(one.weights), Follower(pod.weights)]
    try:
        single = _train(one_path, devices=4)
        hosts = [_train(pod_path, devices=2, process_id=i) for i in range(2)]
        for proc in (single, *hosts):
            assert proc.wait(900) == 0, proc.stderr.read()[-4000:]
    finally:
        for p in pullers:
            p.stop.set()
            p.thread.join(10)
        stop_one.set()
        stop_pod.set()
    reference, pod_losses = _losses(tmp_path / "one"), _losses(tmp_path / "pod")
    assert sorted(reference) == sorted(pod_losses) == list(range(1, STEPS + 1))
    for step, loss in reference.items():
        assert pod_losses[step] == pytest.approx(loss, abs=1e-5), step
    a = load_file(str(tmp_path / "one" / "export" / f"step-{STEPS}" / "model.safetensors"))
    b = load_file(str(tmp_path / "pod" / "export" / f"step-{STEPS}" / "model.safetensors"))
    assert a.keys() == b.keys()
    pod_lines = [json.loads(line) for line in (tmp_path / "pod" / "metrics" / "trainer.jsonl").read_text().splitlines()]
    assert len(pod_lines) == STEPS + 1 and pod_lines[-1]["train/stalled"] == 1.0  # process 0 logs
    # the per-task trace (selection and TIS on: old log-probs gathered from both hosts' rows)
    one_tasks, pod_tasks = (_tasks(tmp_path / name) for name in ("one", "pod"))
    assert sorted(one_tasks) == sorted(pod_tasks) and {step for step, _ in one_tasks} == set(range(1, STEPS + 1))
    assert len(one_tasks) == 2 * STEPS  # two tasks a batch
    for key, want in one_tasks.items():
        got = pod_tasks[key]
        assert (got["steps"], got["kept"]) == (want["steps"], want["kept"]) and 0 < want["kept"] <= want["steps"]
        for sign in ("pos", "neg"):
            assert got[f"tis/tokens_{sign}"] == want[f"tis/tokens_{sign}"]
            if want[f"tis/weight_{sign}"] is not None:
                assert got[f"tis/weight_{sign}"] == pytest.approx(want[f"tis/weight_{sign}"], rel=1e-4)
    assert any(t["tis/weight_pos"] is not None for t in one_tasks.values())
    for name in a:
        np.testing.assert_allclose(b[name], a[name], atol=1e-5, err_msg=name)
    common = set(pullers[0].versions) & set(pullers[1].versions)
    assert common, (sorted(pullers[0].versions), sorted(pullers[1].versions))
    for v in common:  # the same tensors up to float rounding
        single, sharded = pullers[0].versions[v], pullers[1].versions[v]
        assert single.keys() == sharded.keys()
        for name in single:
            np.testing.assert_allclose(sharded[name], single[name], atol=1e-5, err_msg=name)
        shares, served, total = pullers[1].sent[v]
        assert len(shares) == 2 and sum(shares) == total
        assert served == shares and all(0 < share < total for share in shares), (v, shares, served)
