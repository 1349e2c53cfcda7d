"""The run config: one frozen dataclass per role, composed. Every file in configs/ is one.

Role sections live beside their roles (envs.config, dart_jax.data.config,
dart_jax.train.config, rollout_gpu.config) and are plain dataclasses, so loading a config
imports no JAX. The run's own section says how the supervisor runs them: the mode, the
phases and the placement table (which roles, how many, on which launcher).
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from dart_jax.config.loader import bounded
from dart_jax.data.config import DataManagerConfig
from dart_jax.run.evaluate import EvalConfig
from dart_jax.run.plan import PlanConfig
from dart_jax.run.tasks import JobConfig
from dart_jax.run.tpu import TPUConfig
from dart_jax.train.config import TrainerConfig
from dart_jax.train.main import TrainRunConfig
from dart_jax.wire.config import WeightSyncConfig
from envs.config import EnvServerConfig
from rollout_gpu.config import RolloutConfig, kv_bytes_per_token, policy_hf_config


Role = Literal["data-manager", "env-server", "rollout", "trainer"]
Phase = Literal["demos", "sft", "eval", "rl"]


@dataclasses.dataclass(frozen=True)
class RoleSpec:
    """One row of the placement table: `count` processes of a role on a launcher. A role
    that dies is restarted (with backoff) up to `max_restarts` times; one more death stops
    the run. `resources` are the launcher's (Ray: {"GPU": 1} for a rollout worker)."""
    role: Role
    count: int = bounded(1, ge=1)
    launcher: Literal["local", "ray"] = "local"
    max_restarts: int = bounded(5, ge=0)
    resources: dict[str, float] = dataclasses.field(default_factory=dict)


PLACEMENT = (RoleSpec("data-manager"), RoleSpec("env-server"), RoleSpec("rollout"), RoleSpec("trainer"))


@dataclasses.dataclass(frozen=True)
class RunSection:
    """Where the run writes (`root/name`, see dart_jax.rundir), its seed (not 0: the seed of
    every component, `RunConfig.seeded`), and how `dart-jax run` runs it. `mode`: async (DART: roles never wait on each other) or sync (rounds: roll
    out with the newest version, train on exactly that, publish, every worker syncs).
    `phases`, in order: demos (oracle demonstrations into the experience pool), sft
    (bootstrap on them), eval (held-out success), rl (the decoupled loop)."""
    name: str = "local"
    root: str = "runs"
    seed: int = bounded(0, ge=0)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    mode: Literal["async", "sync"] = "async"
    phases: tuple[Phase, ...] = ("rl",)
    placement: tuple[RoleSpec, ...] = PLACEMENT
    heartbeat_s: float = bounded(2.0, gt=0)
    ready_timeout_s: float = bounded(300.0, gt=0)
    view: Literal["auto", "live", "lines", "off"] = "auto"
    ray_address: str = ""  # roles placed on the `ray` launcher join this cluster ("" = auto)

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name or self.name.startswith("."):
            raise ValueError(f"run name {self.name!r} must be a plain directory name")


@dataclasses.dataclass(frozen=True)
class PolicySection:
    """The policy's Hugging Face directory (UI-TARS-1.5-7B, DART-GUI-7B, ...). Empty: the
    run builds a tiny Qwen2.5-VL-shaped policy with its own tokenizer (no download)."""
    hf_dir: str = ""
    tiny_seed: int = bounded(0, ge=0)
    tiny: dict[str, float] = dataclasses.field(default_factory=dict)  # TinySpec sizes (text_layers: 4, ...)

    def tiny_dict(self) -> dict:
        """`tiny` as TinySpec arguments (whole numbers where the spec takes ints)."""
        from dart_jax.models.tiny import TinySpec
        kinds = {f.name: f.type for f in dataclasses.fields(TinySpec)}
        unknown = sorted(set(self.tiny) - set(kinds))
        if unknown:
            raise ValueError(f"policy.tiny: unknown sizes {unknown}")
        return {k: int(v) if kinds[k] in (int, "int") else v for k, v in self.tiny.items()}


@dataclasses.dataclass(frozen=True)
class SFTConfig:
    """The `sft` phase: supervised steps on the demonstrations before RL (its optimizer;
    everything else as the trainer section says)."""
    steps: int = bounded(60, ge=1)
    lr: float = bounded(1e-3, gt=0)
    schedule: Literal["constant", "cosine", "linear"] = "cosine"
    warmup_steps: int = bounded(0, ge=0)

    def trainer(self, base: TrainerConfig) -> TrainerConfig:
        optimizer = dataclasses.replace(base.optimizer, lr=self.lr, schedule=self.schedule,
                                        warmup_steps=self.warmup_steps, total_steps=self.steps)
        checkpoint = dataclasses.replace(base.checkpoint, every_steps=self.steps)
        return dataclasses.replace(base, mode="sft", optimizer=optimizer, checkpoint=checkpoint)


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
    job: JobConfig = JobConfig()
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

    def __post_init__(self) -> None:
        if self.weights.dtype != self.rollout.engine.dtype:
            raise ValueError(f"weights.dtype {self.weights.dtype} must be the rollout engine's dtype "
                             f"{self.rollout.engine.dtype}: the engine loads what travels")
        if (hf := policy_hf_config(self.policy.hf_dir, self.plan.model_config)) is not None:
            engine = self.rollout.engine
            engine.check_kv_cache(kv_bytes_per_token(hf, engine.dtype), self.policy.hf_dir or self.plan.model_config)
