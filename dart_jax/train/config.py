"""Trainer config: frozen dataclasses of plain types, loadable from YAML (dart_jax.config).

Defaults follow the DART paper era (DART.md): dual-clip PPO 0.1 / 0.28 / c=10, k3 KL 0.1,
TIS C=1, top 80% of steps by entropy, AdamW constant lr 1e-6, weight decay 0.1, clip 2.0.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Literal, Optional, Union

from dart_jax.config.loader import bounded

SCREEN_CACHE_BYTES = 4 * 2**30  # processed screenshots kept per batch (train/screens.py)


@dataclasses.dataclass(frozen=True)
class DualClipLoss:
    """Token-level PPO with a lower bound on negative-advantage losses (dual clip)."""
    type: Literal["dual_clip"] = "dual_clip"
    clip_low: float = bounded(0.1, ge=0.0, lt=1.0)
    clip_high: float = bounded(0.28, ge=0.0)
    clip_c: float = bounded(10.0, gt=1.0)


@dataclasses.dataclass(frozen=True)
class GSPOLoss:
    """Sequence-level importance ratio (geometric mean of token ratios), clipped."""
    type: Literal["gspo"] = "gspo"
    clip_low: float = bounded(3e-4, ge=0.0, lt=1.0)
    clip_high: float = bounded(4e-4, ge=0.0)


Aggregation = Literal["token_mean", "seq_mean_token_mean"]


@dataclasses.dataclass(frozen=True)
class LossConfig:
    policy: Union[DualClipLoss, GSPOLoss] = DualClipLoss()
    aggregation: Aggregation = "token_mean"
    kl_coef: float = bounded(0.1, ge=0.0)  # k3 KL to the frozen reference; 0 skips it
    entropy_coef: float = bounded(0.0, ge=0.0)  # entropy bonus; 0: entropy is a metric only
    advantage_eps: float = bounded(1e-6, gt=0.0)
    # "step": group statistics over steps (DART: long trajectories weigh more);
    # "trajectory": over trajectories, and each trajectory's steps share one unit of weight.
    advantage_normalize: Literal["step", "trajectory"] = "step"
    # the policy the PPO clip (and dual clip) measure the ratio against: "trainer", the
    # trainer's log-probs before this batch's first update (DART; with one update per batch
    # the ratio is 1 and no clip ever acts); "behaviour", the log-probs the rollout engine
    # sampled with, so a token whose probability already moved past the clip since it was
    # sampled (one version or more ago) is pushed no further. The gradient's importance
    # weight stays TIS's either way (losses.clipped_policy_loss). Demonstrations, which have
    # no sampler log-probs, are clipped against the trainer's. Token-level dual clip only.
    clip_to: Literal["trainer", "behaviour"] = "trainer"

    def __post_init__(self) -> None:
        if self.clip_to == "behaviour" and self.policy.type != "dual_clip":
            raise ValueError(f"loss.clip_to behaviour needs the token-level dual clip, not {self.policy.type}")


@dataclasses.dataclass(frozen=True)
class TISConfig:
    """Truncated importance sampling against the rollout engine's logprobs."""
    enabled: bool = True
    level: Literal["token", "sequence"] = "token"
    cap: float = bounded(1.0, gt=0.0)


@dataclasses.dataclass(frozen=True)
class SelectionConfig:
    """Keep the top `fraction` of steps by mean token entropy (train/selection.py): over the
    whole batch ("batch"), or per GRPO group and advantage sign with each one's weight
    restored, so a group's signed weights still sum to zero ("balanced")."""
    enabled: bool = True
    fraction: float = bounded(0.8, gt=0.0, le=1.0)
    scope: Literal["batch", "balanced"] = "balanced"


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    lr: float = bounded(1e-6, gt=0.0)
    schedule: Literal["constant", "cosine", "linear"] = "constant"
    warmup_steps: int = bounded(0, ge=0)
    total_steps: int = bounded(1000, ge=1)  # horizon of the cosine / linear decay
    weight_decay: float = bounded(0.1, ge=0.0)
    b1: float = bounded(0.9, ge=0.0, lt=1.0)
    b2: float = bounded(0.999, ge=0.0, lt=1.0)
    eps: float = bounded(1e-8, gt=0.0)
    grad_clip: float = bounded(2.0, gt=0.0)


@dataclasses.dataclass(frozen=True)
class BucketConfig:
    """Static shapes: each batch pads to the smallest bucket that holds it."""
    seq_lens: tuple[int, ...] = (256, 512, 1024, 2048, 4096)
    num_slots: tuple[int, ...] = (256, 1024, 4096)  # vision patch slots per row (multiples of the window)
    rows: int = bounded(8, ge=1)  # rows per micro-batch
    # steps one row may hold: >1 packs short steps into shared rows where that pads less than a
    # row each (train/pipeline.py; RL batches only, an SFT batch is a number of steps)
    pack: int = bounded(1, ge=1)
    accum_steps: int = bounded(1, ge=1)  # micro-batches per optimizer update

    def __post_init__(self) -> None:
        for name in ("seq_lens", "num_slots"):
            vals = getattr(self, name)
            if not vals or list(vals) != sorted(set(vals)):
                raise ValueError(f"{name} must be non-empty, increasing and unique, got {vals}")


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    """Log-prob kernel chunks; null: chosen per backend and shape (kernels.auto_chunks)."""
    chunk_tokens: Optional[int] = bounded(None, ge=1)
    chunk_vocab: Optional[int] = bounded(None, ge=1)


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    every_steps: int = bounded(50, ge=1)
    keep: int = bounded(3, ge=1)
    async_save: bool = True


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    data: int = bounded(1, ge=1)
    fsdp: int = bounded(1, ge=1)
    tp: int = bounded(1, ge=1)


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
    """A multi-host trainer (`jax.distributed`): every host runs the same `dart-jax train`
    with the same config and forms one mesh. `auto`: JAX finds the coordinator itself
    (Cloud TPU, GKE). `explicit`: `coordinator` (host:port of process 0) and
    `num_processes`; each host's `process_id`, or -1 to read DART_PROCESS_ID, so hosts differ
    only by their environment. CPU hosts exchange through gloo."""
    mode: Literal["off", "auto", "explicit"] = "off"
    coordinator: str = ""
    num_processes: int = bounded(1, ge=1)
    process_id: int = bounded(-1, ge=-1)


@dataclasses.dataclass(frozen=True)
class TrainerConfig:
    mode: Literal["rl", "sft"] = "rl"
    compute_dtype: Literal["float32", "bfloat16"] = "float32"
    # checkpoint policy of the scanned layers (models/stack.py): "none" keeps every activation,
    # "full" only each layer's input, "dots" / "dots_no_batch" matmul outputs too, "offload"
    # moves the weight-matmul outputs to pinned host memory (where the backend has it)
    remat: Literal["none", "full", "dots", "dots_no_batch", "offload"] = "none"
    # attention kernel preference (models/attention.py): auto = cuDNN on GPU, splash on TPU,
    # the blockwise XLA path elsewhere
    attention: Literal["auto", "xla", "dense", "cudnn", "splash"] = "auto"
    updates_per_batch: int = bounded(1, ge=1)  # >1 recomputes the old logprobs first
    # processed screenshots kept per batch (an LRU; a 1920x1080 screenshot is about 50 MB of
    # pixel values): each is fetched and decoded once while those still to be reused fit
    screen_cache_bytes: int = bounded(SCREEN_CACHE_BYTES, ge=0)
    seed: int = 0
    loss: LossConfig = LossConfig()
    tis: TISConfig = TISConfig()
    selection: SelectionConfig = SelectionConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    buckets: BucketConfig = BucketConfig()
    kernel: KernelConfig = KernelConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    mesh: MeshConfig = MeshConfig()
    # -- how long the trainer runs and on what (RUN_FIELDS); paths are relative to the run directory
    steps: int = bounded(100, ge=1)  # optimizer updates in total (a resumed run counts on)
    # RL: the longest wait for one curated batch before the trainer stops early at the step it
    # reached (metrics: train/stalled; its checkpoint and export as usual). It also bounds how
    # long an unanswering data manager is asked again (then the trainer fails, and the
    # supervisor restarts it from its checkpoint). None: no limit.
    batch_wait_s: float | None = bounded(None, gt=0)
    # the training loop's wall-clock budget in seconds, from its start in this process (a
    # resumed trainer gets it afresh): the trainer stops before the first update that would
    # begin past it, or when it runs out waiting for a batch (metrics: train/out_of_time;
    # checkpoint and export as usual). On a pod, process 0's clock decides. `dart-jax run`
    # gives it to the RL phase only. None: no limit.
    max_seconds: float | None = bounded(None, gt=0)
    sft_data: str = "data/demos"  # SFT: a *.traj directory or a JSONL file
    export: bool = True
    # RL: compile the update for each bucket, smallest first, while the first batch is awaited
    # (train/precompile.py); off: each bucket compiles when a batch first needs it
    precompile: bool = True
    distributed: DistributedConfig = DistributedConfig()

    # a resumed run may change these: they are not part of what its checkpoints were trained under
    RUN_FIELDS: ClassVar[frozenset[str]] = frozenset(
        {"steps", "batch_wait_s", "max_seconds", "sft_data", "export", "precompile", "distributed"})

    def learning(self) -> dict:
        """The settings the train state depends on (all but RUN_FIELDS): what a resume must match."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in self.RUN_FIELDS}


@dataclasses.dataclass(frozen=True)
class SFTConfig:
    """The `sft` phase of a run: supervised steps on the demonstrations before RL (its
    optimizer; everything else as the trainer section says)."""
    steps: int = bounded(60, ge=1)
    lr: float = bounded(1e-3, gt=0)
    schedule: Literal["constant", "cosine", "linear"] = "cosine"
    warmup_steps: int = bounded(0, ge=0)

    def trainer(self, base: TrainerConfig) -> TrainerConfig:
        optimizer = dataclasses.replace(base.optimizer, lr=self.lr, schedule=self.schedule,
                                        warmup_steps=self.warmup_steps, total_steps=self.steps)
        checkpoint = dataclasses.replace(base.checkpoint, every_steps=self.steps)
        return dataclasses.replace(base, mode="sft", optimizer=optimizer, checkpoint=checkpoint)
