"""The run config: every package's section, composed. Every file in configs/ is one.

Each section lives beside its package, in that package's config.py (envs, data, train,
rollout_gpu, wire, eval, capacity, run and its launchers), as plain frozen dataclasses, so
loading a config imports no JAX. This module is the top of the config layer: it imports every
section and nothing imports it but the commands that load a whole run config.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from dart_jax.capacity.config import PlanConfig
from dart_jax.data.config import DataManagerConfig, TasksConfig
from dart_jax.eval.config import EvalConfig
from dart_jax.run.config import PolicySection, RunSection
from dart_jax.run.launchers.config import TPUConfig
from dart_jax.train.config import SFTConfig, TrainerConfig, TrainRunConfig
from dart_jax.wire import WireConfig
from dart_jax.wire.weights import WeightSyncConfig
from envs.config import EnvServerConfig
from rollout_gpu.config import RolloutConfig


@dataclasses.dataclass(frozen=True)
class RunConfig:
    RENAMED: ClassVar[dict[str, str]] = {"job": "tasks"}  # old key -> its name now (the loader maps it)
    run: RunSection = RunSection()
    policy: PolicySection = PolicySection()
    envs: EnvServerConfig = EnvServerConfig()
    data: DataManagerConfig = DataManagerConfig()
    trainer: TrainerConfig = TrainerConfig()
    train: TrainRunConfig = TrainRunConfig()
    rollout: RolloutConfig = RolloutConfig()
    weights: WeightSyncConfig = WeightSyncConfig()
    tasks: TasksConfig = TasksConfig()
    sft: SFTConfig = SFTConfig()
    eval: EvalConfig = EvalConfig()
    plan: PlanConfig = PlanConfig()  # `dart-jax plan`: model shape, chip, screenshots
    tpu: TPUConfig = TPUConfig()  # `dart-jax tpu`: the Cloud TPU slice of the trainer

    def seeded(self) -> "RunConfig":
        """`run.seed`, when not 0, as every component's seed: the tiny policy's init, the
        trainer's, the rollout engines' sampling and the evaluation's (0: each keeps its own)."""
        seed, replace = self.run.seed, dataclasses.replace
        if seed == 0:
            return self
        return replace(self, policy=replace(self.policy, tiny_seed=seed), trainer=replace(self.trainer, seed=seed),
                       rollout=replace(self.rollout, engine=replace(self.rollout.engine, seed=seed)),
                       eval=replace(self.eval, seed=seed))

    def env_wires(self) -> list[WireConfig]:
        """The endpoint of each env server of the placement: the configured one, then the next ports."""
        count = sum(s.count for s in self.run.placement if s.role == "env-server") or 1
        return [dataclasses.replace(self.envs.wire, endpoint=_nth_endpoint(self.envs.wire.endpoint, i))
                for i in range(count)]

    def __post_init__(self) -> None:
        if self.weights.dtype != self.rollout.engine.dtype:
            raise ValueError(f"weights.dtype {self.weights.dtype} must be the rollout engine's dtype "
                             f"{self.rollout.engine.dtype}: the engine loads what travels")


def _nth_endpoint(endpoint: str, i: int) -> str:
    if i == 0:
        return endpoint
    if endpoint.startswith("tcp://"):
        host, _, port = endpoint.rpartition(":")
        return f"{host}:{int(port) + i}"
    return f"{endpoint}.{i}"
