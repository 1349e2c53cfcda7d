"""GPU roles on one box: each local instance sees its own devices and takes the share of
them its placement row says; placements that would collide on a device are refused when
the config loads. Two fake GPUs: the environment is what is checked, no device is used."""

import dataclasses
import json
import sys
import time

import pytest

from dart_jax.config import ConfigError, load
from dart_jax.run.schema import RunConfig
from dart_jax.run.devices import instance_env
from dart_jax.run.launchers.local import Instance, LocalLauncher
from dart_jax.run.supervisor import Supervisor
from dart_jax.rundir import RunDir

LOCAL = "configs/local.yaml"
SERVERS = "{role: data-manager}, {role: env-server}"
SHARED = (f"run.placement=[{SERVERS}, {{role: trainer, gpus: [0], memory_fraction: 0.5}}, "
          "{role: rollout, count: 2, gpus: [0, 1], memory_fraction: 0.4, env: {VLLM_LOGGING_LEVEL: WARNING}}]")
PROBE = ("import json, os, sys, yaml; cfg = yaml.safe_load(open(sys.argv[1])); print(json.dumps({"
         "'cuda': os.environ.get('CUDA_VISIBLE_DEVICES'), 'jax': os.environ.get('XLA_PYTHON_CLIENT_MEM_FRACTION'), "
         "'vllm': cfg['rollout']['engine']['gpu_memory_utilization'], 'level': os.environ.get('VLLM_LOGGING_LEVEL')}))")


class Probe(Instance):
    """The role's process, reporting the environment and engine share it was started with."""

    def argv(self) -> list[str]:
        return [sys.executable, "-c", PROBE, str(self.config)]


class ProbeLauncher(LocalLauncher):
    def start(self, instance, spec=None, index=0):
        return super().start(Probe(**dataclasses.asdict(instance)), spec, index)


def test_each_instance_sees_its_own_gpus_and_takes_its_rows_share(tmp_path):
    cfg = load(RunConfig, LOCAL, [SHARED, f"run.root={tmp_path}"])
    with Supervisor(cfg, RunDir.create(tmp_path / cfg.run.name), {"local": ProbeLauncher()}) as sup:
        sup.start({"trainer", "rollout"})
        deadline = time.monotonic() + 60
        while any(m.process.exit_code() is None for m in sup.members) and time.monotonic() < deadline:
            time.sleep(0.1)
        seen = {m.instance.name: json.loads(m.instance.log.read_text()) for m in sup.members}
    assert seen == {
        "trainer": {"cuda": "0", "jax": "0.5", "vllm": 0.85, "level": None},  # JAX alone would take 75% of each GPU
        "rollout-0": {"cuda": "0", "jax": None, "vllm": 0.4, "level": "WARNING"},
        "rollout-1": {"cuda": "1", "jax": None, "vllm": 0.4, "level": "WARNING"},
    }


def test_tensor_parallel_workers_take_their_devices_in_turn():
    cfg = load(RunConfig, LOCAL, [f"run.placement=[{SERVERS}, {{role: trainer, gpus: [4]}}, "
                                  "{role: rollout, count: 2, gpus: [0, 1, 2, 3]}]",
                                  "rollout.engine.tensor_parallel_size=2"])
    rollout = cfg.run.placement[3]
    assert [instance_env(rollout, i, 2)["CUDA_VISIBLE_DEVICES"] for i in range(2)] == ["0,1", "2,3"]
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION" not in instance_env(cfg.run.placement[2], 0, 2)  # its own device: JAX's default


@pytest.mark.parametrize("placement, message", [
    ("{role: trainer, gpus: [0]}, {role: rollout, gpus: [0]}",
     "GPU 0 is shared by trainer and rollout without saying how much each takes"),
    ("{role: trainer, gpus: [0], memory_fraction: 0.5}, {role: rollout, count: 2, gpus: [0], memory_fraction: 0.3}",
     "GPU 0 is shared by trainer and rollout-0 and rollout-1, whose memory_fraction add up to 1.1 > 1"),
    ("{role: trainer}, {role: rollout, gpus: [0]}", "rollout names its gpus but trainer names none"),
    ("{role: trainer, gpus: [2]}, {role: rollout, gpus: [0, 1, 3]}", "do not split into instances of"),
    ("{role: trainer}, {role: rollout, launcher: ray, gpus: [0]}", "gpus are the local launcher's"),
    ("{role: trainer}, {role: rollout, launcher: ray, env: {A: b}}", "env is the local launcher's"),
    ("{role: trainer, gpus: [0, 0]}, {role: rollout, gpus: [1]}", "must be distinct device numbers"),
    ("{role: trainer, env: {CUDA_VISIBLE_DEVICES: '1'}}, {role: rollout}", "not env"),
])
def test_placements_that_collide_on_a_device_are_refused_at_load(placement, message):
    overrides = [f"run.placement=[{{role: data-manager}}, {{role: env-server}}, {placement}]",
                 "rollout.engine.tensor_parallel_size=2" if "[0, 1, 3]" in placement else "run.seed=0"]
    with pytest.raises(ConfigError, match=message):
        load(RunConfig, LOCAL, overrides)
