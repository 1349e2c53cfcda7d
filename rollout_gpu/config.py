"""Config of a rollout worker: its engine, its sampling, its episodes and its links.

    rollout:
      episodes: 8                       # K episodes at once on one engine
      engine: {dtype: float32, max_model_len: 8192, kv_cache_mb: 256}
      sampling: {temperature: 1.0, max_tokens: 500}

Sampling is restricted to what the trainer reproduces when it scores the same tokens: the
temperature. top-p, top-k, min-p and penalties change the distribution vLLM samples from,
so the log-probs it reports would no longer be those of the policy the trainer computes,
and truncated importance sampling would correct towards the wrong distribution (DART's
release sampled with a frequency penalty its TIS ignored). The config refuses them.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import msgspec

from dart_jax.agent.config import PromptConfig
from dart_jax.config import bounded
from dart_jax.wire.config import WireConfig
from dart_jax.wire.messages import Id


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """The vLLM engine. `kv_cache_mb` > 0 sizes the KV cache explicitly (CPU: the default
    reserves most of the machine's memory); 0 leaves it to `gpu_memory_utilization`.
    `load`: how new weights go in (rollout_gpu.vllm_ext): `shadow` prepares them beside the
    live model and swaps at the pause (one extra copy of the weights, pause of
    milliseconds), `inplace` reloads at the pause; `auto` is shadow on CPU, inplace on GPU.
    `pause`: `wait` lets in-flight requests finish before a swap (a response never mixes
    versions) and clears the prefix cache; `keep` freezes them and marks the responses that
    straddle an update, and keeps the cache (a request queued but not yet started before the
    swap may reuse the old weights' prefix blocks: measure with `wait` where log-probs must
    be exact)."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    max_model_len: int = bounded(8192, ge=256)
    max_num_seqs: int = bounded(16, ge=1)
    max_images: int = bounded(5, ge=1)  # per prompt (DART keeps the last 5 screenshots)
    kv_cache_mb: int = bounded(256, ge=0)
    gpu_memory_utilization: float = bounded(0.85, gt=0, le=1)
    tensor_parallel_size: int = bounded(1, ge=1)
    enforce_eager: bool = True  # GPU hosts: false captures CUDA graphs
    seed: int = bounded(0, ge=0)
    load: Literal["auto", "shadow", "inplace"] = "auto"
    pause: Literal["wait", "keep"] = "wait"


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    temperature: float = bounded(1.0, ge=0)  # 0: greedy (evaluation; no log-probs to train on)
    max_tokens: int = bounded(500, ge=1)
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0

    def __post_init__(self) -> None:
        neutral = {"top_p": 1.0, "top_k": 0, "min_p": 0.0, "frequency_penalty": 0.0,
                   "presence_penalty": 0.0, "repetition_penalty": 1.0}
        changed = [k for k, v in neutral.items() if getattr(self, k) != v]
        if changed:
            raise ValueError(f"{', '.join(changed)}: the trainer scores sampled tokens at the sampling "
                             "temperature only, so any other change to the sampling distribution would "
                             "make the rollout log-probs disagree with the policy's (remove them)")


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    """One worker: `episodes` episodes at once against the env servers (empty: the run's
    env server), tasks from the data manager, weights from the trainer's publisher."""
    worker_id: str = "rollout-0"
    episodes: int = bounded(8, ge=1)
    env_servers: tuple[WireConfig, ...] = ()
    engine: EngineConfig = EngineConfig()
    sampling: SamplingConfig = SamplingConfig()
    prompt: PromptConfig = PromptConfig()  # UI-TARS: the last 5 screenshots, 35 responses
    heartbeat_s: float = bounded(5.0, gt=0)
    submit_retry_s: float = bounded(1.0, gt=0)  # first wait before resubmitting (doubles, <= 30 s)
    acquire_wait_s: float = bounded(600.0, gt=0)  # an env slot of the task's backend
    max_steps_cap: int = bounded(100, ge=1)  # never trust an assignment beyond this

    def __post_init__(self) -> None:
        try:  # the data manager refuses any other worker id at its boundary
            msgspec.convert(self.worker_id, Id)
        except msgspec.ValidationError as e:
            raise ValueError(f"worker_id {self.worker_id!r}: {e}") from None
