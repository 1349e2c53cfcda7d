"""A run spread over hosts: what cannot work is refused when the config loads, in one line."""

import subprocess
import sys
from pathlib import Path

import pytest

from dart_jax.config import ConfigError, load

from dart_jax.run.schema import RunConfig

ROOT = Path(__file__).resolve().parents[2]
V5P = ROOT / "configs/tpu/v5p-64.yaml"


def _load(*overrides: str) -> RunConfig:
    return load(RunConfig, V5P, list(overrides))


def test_the_tpu_configs_span_their_slices_with_distributed_auto():
    for path in sorted((ROOT / "configs/tpu").glob("*.yaml")):
        cfg = load(RunConfig, path)
        assert cfg.trainer_hosts() > 1 and cfg.trainer.distributed.mode == "auto", path.name
        assert cfg.trainer.batch_wait_s is not None  # a trainer on a slice never waits forever
        announced = cfg.weights.advertise.format(host="t1v-n-0-w-3", port=5564, process=3)
        assert announced == "tcp://t1v-n-0-w-3:5564", path.name  # each host at its own name


@pytest.mark.parametrize("overrides, message", [
    (["trainer.distributed.mode='off'"],
     "the trainer spans the 8 hosts of v5p-64: trainer.distributed.mode must be auto"),
    (["data.wire.endpoint=tcp://127.0.0.1:5557"],
     "data.wire.endpoint tcp://127.0.0.1:5557 is reached only on its own host, but the data-manager and the "
     "trainer run on different hosts"),
    (["weights.serve.endpoint=ipc:///tmp/w.sock"],
     "weights.serve.endpoint ipc:///tmp/w.sock is reached only on its own host, but the trainer and the rollout"),
    (["weights.advertise=''"], "weights.serve.endpoint tcp://0.0.0.0:5561 binds every interface and every "
     "announcement names each trainer host's bucket server as it is bound: set weights.advertise"),
    (["data.store.db_path=data/store.sqlite"], "the data manager's store /mnt/runs/ui-tars-7b-v5p-64/data/store.sqlite "
     "is on the shared root (nfs), where SQLite's WAL has no locks to rely on"),
    (["run.root=runs"], "run.root 'runs' is each host's own disk, but orbax writes one checkpoint from all 8 hosts"),
    (["tpu.shared_root.kind=none"], "run.root '/mnt/runs' is each host's own disk"),
    (["run.root=/mnt/other"], "run.root '/mnt/other' is each host's own disk"),
    (["run.placement=[{role: trainer, launcher: tpu}]", "tpu.accelerator_type=''"],
     "run.placement puts the trainer on launcher tpu: set tpu.accelerator_type"),
    (["run.placement=[{role: rollout, launcher: tpu}]"], "launcher tpu places one trainer"),
])
def test_what_a_multi_host_run_cannot_do_is_refused(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _load(*overrides)


def test_roles_on_ray_cannot_reach_a_loopback_server_elsewhere():
    rl = ROOT / "configs/rl.yaml"
    ray = "run.placement=[{role: data-manager}, {role: env-server}, {role: rollout, launcher: ray}, {role: trainer}]"
    with pytest.raises(ConfigError, match="data.wire.endpoint tcp://127.0.0.1:5557 is reached only on its own host"):
        load(RunConfig, rl, [ray])
    # bound on every interface, the launcher tells the rollout workers where: allowed
    every_interface = [ray, "data.wire={endpoint: 'tcp://0.0.0.0:5557', allow_remote: true}",
                       "envs.wire={endpoint: 'tcp://0.0.0.0:5555', allow_remote: true}",
                       "weights.announce={endpoint: 'tcp://0.0.0.0:5560', allow_remote: true}",
                       "weights.serve={endpoint: 'tcp://0.0.0.0:5561', allow_remote: true}"]
    load(RunConfig, rl, [*every_interface, "weights.advertise='tcp://{host}:{port}'"])
    # but the trainer's announcements name its bucket servers as bound: 0.0.0.0 reaches nothing
    with pytest.raises(ConfigError, match="binds every interface .* set weights.advertise"):
        load(RunConfig, rl, every_interface)
    assert load(RunConfig, rl).trainer_hosts() == 1  # every role on this machine: loopback is fine


def test_the_refusal_is_one_line_with_exit_code_2():
    out = subprocess.run([sys.executable, "-m", "dart_jax.cli", "config", "show", str(V5P), "trainer.distributed.mode='off'"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "trainer.distributed.mode must be auto" in out.stderr
