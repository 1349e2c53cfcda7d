"""Trainer config: frozen dataclasses of plain types, loadable from YAML (dart_jax.config).

Defaults follow the DART paper era (DART.md): dual-clip PPO 0.1 / 0.28 / c=10, k3 KL 0.1,
TIS C=1, top 80% of steps by entropy, AdamW constant lr 1e-6, weight decay 0.1, clip 2.0.
"""

from __future__ import annotations

import dataclasses
from typing import Literal, Optional, Union

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


@dataclasses.dataclass(frozen=True)
class TISConfig:
    """Truncated importance sampling against the rollout engine's logprobs."""
    enabled: bool = True
    level: Literal["token", "sequence"] = "token"
    cap: float = bounded(1.0, gt=0.0)


@dataclasses.dataclass(frozen=True)
class SelectionConfig:
    """Keep the top `fraction` of steps by mean token entropy."""
    enabled: bool = True
    fraction: float = bounded(0.8, gt=0.0, le=1.0)


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

    def chunks(self, backend: str, tokens: int, vocab: int) -> tuple[int, int]:
        """(chunk_tokens, chunk_vocab) for `tokens` x `vocab` logits on `backend` ("cpu", "gpu",
        "tpu"): the configured sizes, the unset ones chosen for the backend and shape."""
        from dart_jax.train.kernels import auto_chunks

        ct, cv = auto_chunks(backend, tokens, vocab)
        return self.chunk_tokens or ct, self.chunk_vocab or cv


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
