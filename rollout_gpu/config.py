"""Config of a rollout worker: its engine, its sampling, its episodes and its links.

    rollout:
      episodes: 8                       # K episodes at once on one engine
      engine: {dtype: float32, max_model_len: 8192, kv_cache_mb: 0}
      sampling: {temperature: 1.0, max_tokens: 500}

Sampling is restricted to what the trainer reproduces when it scores the same tokens: the
temperature. top-p, top-k, min-p and penalties change the distribution vLLM samples from,
so the log-probs it reports would no longer be those of the policy the trainer computes,
and truncated importance sampling would correct towards the wrong distribution (DART's
release sampled with a frequency penalty its TIS ignored). The config refuses them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from pathlib import Path
from typing import Literal

import msgspec

from dart_jax.agent.config import PromptConfig
from dart_jax.config import bounded
from dart_jax.wire.config import WireConfig
from dart_jax.wire.messages import Id


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """The vLLM engine.

    `kv_cache_mb`: 0 sizes the KV cache per platform (GPU: what `gpu_memory_utilization`
    leaves after the weights; CPU, where vLLM's default would reserve most of the machine:
    256 MiB, raised to hold one `max_model_len` sequence); > 0 sizes it explicitly, and the
    run config refuses a size that cannot hold one `max_model_len` sequence of the policy.

    `load`: how new weights go in (rollout_gpu.vllm_ext): `shadow` loads them beside the
    live model, generation going on, and swaps at the pause (a pause of milliseconds, one
    extra copy of the weights; refused with CUDA graphs, which would keep the old
    addresses); `inplace` reloads at the pause with vLLM's own `reload_weights` (writes into
    the live tensors, so CUDA graphs stay valid; the pause is one load at memory bandwidth);
    `auto` is shadow on CPU, inplace on GPU.

    `pause`: what happens to requests in flight when new weights go in. `keep` freezes them
    and resumes them on the new weights: the pause is the load alone, and every response
    whose prefill, reused KV or tokens span two versions is marked `straddles_update` (never
    trained on). `wait` stops admitting requests and lets the running ones finish first (no
    response spans versions, the prefix cache is cleared; the pause includes the drain)."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    max_model_len: int = bounded(8192, ge=256)
    max_num_seqs: int = bounded(16, ge=1)
    max_images: int = bounded(5, ge=1)  # per prompt (DART keeps the last 5 screenshots)
    kv_cache_mb: int = bounded(0, ge=0)
    gpu_memory_utilization: float = bounded(0.85, gt=0, le=1)
    tensor_parallel_size: int = bounded(1, ge=1)
    enforce_eager: bool = True  # GPU hosts: false captures CUDA graphs
    seed: int = bounded(0, ge=0)
    load: Literal["auto", "shadow", "inplace"] = "auto"
    pause: Literal["wait", "keep"] = "keep"

    def __post_init__(self) -> None:
        if self.load == "shadow" and not self.enforce_eager:
            raise ValueError("load: shadow with enforce_eager: false: CUDA graphs keep the addresses of the weights "
                             "they captured and would go on serving the old version; use load: inplace (or auto)")

    def kv_cache_bytes(self, kv_bytes_per_token: int, on_cpu: bool) -> int | None:
        """The KV cache to ask vLLM for (None: the platform's own sizing)."""
        if self.kv_cache_mb:
            return self.kv_cache_mb * 2**20
        return max(CPU_KV_CACHE_MB * 2**20, kv_bytes_per_token * self.max_model_len) if on_cpu else None

    def check_kv_cache(self, kv_bytes_per_token: int, model: str) -> None:
        """Refuse an explicit KV cache that cannot hold one `max_model_len` sequence of `model`
        (`kv_bytes_per_token` is per device: `kv_bytes_per_token(..., tensor_parallel_size)`)."""
        need = kv_bytes_per_token * self.max_model_len
        if self.kv_cache_mb and self.kv_cache_mb * 2**20 < need:
            raise ValueError(f"rollout.engine.kv_cache_mb {self.kv_cache_mb} holds {self.kv_cache_mb * 2**20 // kv_bytes_per_token} "
                             f"tokens of {model}; max_model_len {self.max_model_len} needs {-(-need // 2**20)} MiB "
                             "(set kv_cache_mb: 0 to size it per platform)")


    def check_shadow(self, weight_bytes: int, device_bytes: int) -> None:
        """Refuse `load: shadow` on a GPU whose memory cannot hold vLLM's budget
        (`gpu_memory_utilization` of it) plus the shadow's copy of this device's weights: the
        copy lives outside the budget, so every update would fail for memory."""
        if self.load != "shadow":
            return
        copy = weight_bytes // self.tensor_parallel_size
        budget = int(self.gpu_memory_utilization * device_bytes)
        if budget + copy > device_bytes:
            raise ValueError(f"load: shadow keeps a second copy of the weights ({copy / 2**30:.1f} GiB a device) "
                             f"outside vLLM's budget of {budget / 2**30:.1f} GiB (gpu_memory_utilization "
                             f"{self.gpu_memory_utilization}) on a {device_bytes / 2**30:.1f} GiB device: use "
                             f"load: inplace, or gpu_memory_utilization <= {(device_bytes - copy) / device_bytes:.2f}")


CPU_KV_CACHE_MB = 256


def policy_hf_config(*candidates: str) -> dict | None:
    """The first readable config.json among directories or files `candidates` ("" skipped)."""
    for c in filter(None, candidates):
        with contextlib.suppress(OSError, ValueError):  # is_dir too raises where this user may not look
            path = Path(c) / "config.json" if Path(c).is_dir() else Path(c)
            return json.loads(path.read_text())
    return None


def kv_bytes_per_token(hf_config: dict, dtype: str, tensor_parallel_size: int = 1) -> int:
    """Bytes of K and V one token takes in every decoder layer on one device (Qwen2 text
    config): tensor parallelism splits the KV heads over the devices (vLLM keeps at least one
    a device, replicating them when there are fewer heads than devices)."""
    text = hf_config.get("text_config", hf_config)
    heads = text["num_attention_heads"]
    head_dim = text.get("head_dim") or text["hidden_size"] // heads
    size = 4 if dtype == "float32" else 2
    kv_heads = max(1, text.get("num_key_value_heads", heads) // tensor_parallel_size)
    return 2 * text["num_hidden_layers"] * kv_heads * head_dim * size


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    # > 0: the trainer scores the sampled tokens at this temperature (greedy evaluation sets
    # its own temperature per request; a greedy rollout has no distribution to train on)
    temperature: float = bounded(1.0, gt=0)
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
