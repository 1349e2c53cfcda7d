"""The run config: one frozen dataclass per role, composed. Every file in configs/ is one.

Role sections live beside their roles (envs.config, dart_jax.data.config,
dart_jax.train.config) and are plain dataclasses, so loading a config imports no JAX.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from dart_jax.config.loader import bounded
from dart_jax.data.config import DataManagerConfig
from dart_jax.jobs.config import LocalJobConfig
from dart_jax.jobs.train import TrainRunConfig
from dart_jax.run.plan import PlanConfig
from dart_jax.run.tpu import TPUConfig
from dart_jax.train.config import TrainerConfig
from dart_jax.wire.weights import WeightSyncConfig
from envs.config import EnvServerConfig
from rollout_gpu.config import RolloutConfig


@dataclasses.dataclass(frozen=True)
class RunSection:
    """Where the run writes (`root/name`, see dart_jax.rundir) and its base seed."""
    name: str = "local"
    root: str = "runs"
    seed: int = bounded(0, ge=0)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name or self.name.startswith("."):
            raise ValueError(f"run name {self.name!r} must be a plain directory name")


@dataclasses.dataclass(frozen=True)
class PolicySection:
    """The policy's Hugging Face directory (UI-TARS-1.5-7B, DART-GUI-7B, ...). Empty: the
    run builds a tiny Qwen2.5-VL-shaped policy with its own tokenizer (no download)."""
    hf_dir: str = ""
    tiny_seed: int = bounded(0, ge=0)


@dataclasses.dataclass(frozen=True)
class RunConfig:
    run: RunSection = RunSection()
    policy: PolicySection = PolicySection()
    envs: EnvServerConfig = EnvServerConfig()
    data: DataManagerConfig = DataManagerConfig()
    trainer: TrainerConfig = TrainerConfig()
    train: TrainRunConfig = TrainRunConfig()
    rollout: RolloutConfig = RolloutConfig()
    weights: WeightSyncConfig = WeightSyncConfig()
    job: LocalJobConfig = LocalJobConfig()
    plan: PlanConfig = PlanConfig()  # `dart-jax plan`: model shape, chip, screenshots
    tpu: TPUConfig = TPUConfig()  # `dart-jax tpu`: the Cloud TPU slice of the trainer

    def __post_init__(self) -> None:
        if self.weights.dtype != self.rollout.engine.dtype:
            raise ValueError(f"weights.dtype {self.weights.dtype} must be the rollout engine's dtype "
                             f"{self.rollout.engine.dtype}: the engine loads what travels")
