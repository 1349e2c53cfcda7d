"""One vLLM engine (AsyncLLM) serving the policy: exact samples, and new weights in place.

    engine = await Engine.start(hf_dir, cfg.engine, cfg.sampling)
    sample = await engine.sample(prompt)            # token ids, log-probs, version
    event = await engine.update(announce, serve)    # pull beside generation, swap at a pause
    engine.shutdown()

The same code drives vLLM's CUDA build on GPU hosts and its CPU build locally.

Exactness. The prompt goes in as token ids (one <|image_pad|> per image; vLLM expands
it, and the expansion is checked against the prompt builder's ids), responses come back as
the sampled ids, never re-tokenized. `logprobs_mode="processed_logprobs"`: the log-probs
of the distribution the token was drawn from, i.e. after temperature scaling, which is
what the trainer computes at the same temperature (raw log-probs would be those of
temperature 1). Prefix caching is on, salted with the policy version, so a prompt never
reuses KV computed by other weights. Each request's output reports the weight versions
that produced its tokens; a response spanning two is marked `straddles_update`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import logging
import os
import time
import uuid
from pathlib import Path

import numpy as np
import zmq
import zmq.asyncio

from dart_jax.agent.prompt import Prompt
from dart_jax.config import to_dict
from dart_jax.wire import codec
from dart_jax.wire.config import WireConfig
from dart_jax.wire.messages import WeightAnnounce
from rollout_gpu.config import EngineConfig, SamplingConfig
from rollout_gpu.episode import Sample

log = logging.getLogger(__name__)
EXTENSION = "rollout_gpu.vllm_ext.WeightSyncExtension"


@dataclasses.dataclass(frozen=True)
class SyncEvent:
    """One weight update of this engine (wall-clock times)."""
    version: int
    started: float  # pull began (generation goes on)
    paused: float  # generation paused
    resumed: float  # generation resumed with the new version
    ok: bool
    error: str = ""


class PILProcessorError(ValueError):
    """The model directory asks for transformers' PIL image processor."""


def check_image_processor(hf_dir: str | Path) -> None:
    """Refuse PIL pixel processing: vLLM's torchvision path is what the trainer's numpy
    processor matches bit for bit; PIL resizes differently (a 1e-3 log-prob gap)."""
    path = Path(hf_dir) / "preprocessor_config.json"
    cfg = json.loads(path.read_text()) if path.exists() else {}
    if cfg.get("use_fast") is False or cfg.get("backend") == "pil" or \
            str(cfg.get("image_processor_type", "")).endswith("ImageProcessorPil"):
        raise PILProcessorError(f"{path}: asks for the PIL image processor; the rollout engine must use the "
                                "torchvision one the trainer's pixels match (remove use_fast/backend)")


def engine_args(hf_dir: str | Path, cfg: EngineConfig):
    """vLLM's arguments. On CPU, prefills are never chunked: vLLM CPU 0.32 rewinds a seeded
    request's random generator after a partial prefill, which CPU generators cannot do
    (`CPU Generator does not use offset` kills the engine); evaluation seeds its requests."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    return AsyncEngineArgs(
        enable_chunked_prefill=not _on_cpu(),
        model=str(hf_dir), dtype=cfg.dtype, max_model_len=cfg.max_model_len, seed=cfg.seed,
        enforce_eager=cfg.enforce_eager, max_num_seqs=cfg.max_num_seqs,
        limit_mm_per_prompt={"image": cfg.max_images}, tensor_parallel_size=cfg.tensor_parallel_size,
        kv_cache_memory_bytes=cfg.kv_cache_mb * 2**20 if cfg.kv_cache_mb else None,
        gpu_memory_utilization=cfg.gpu_memory_utilization, enable_prefix_caching=True,
        logprobs_mode="processed_logprobs", worker_extension_cls=EXTENSION)


class Engine:
    def __init__(self, llm, cfg: EngineConfig, sampling: SamplingConfig, version: int):
        self.llm, self.cfg, self.sampling = llm, cfg, sampling
        self.version = version
        self.load_mode = cfg.load if cfg.load != "auto" else ("shadow" if _on_cpu() else "inplace")
        self._ids = itertools.count()
        self._update_lock = asyncio.Lock()
        self._live = asyncio.Event()  # cleared while an update holds the engine paused
        self._live.set()

    @classmethod
    async def start(cls, hf_dir: str | Path, cfg: EngineConfig, sampling: SamplingConfig,
                    version: int = 0) -> "Engine":
        """Start the engine on `hf_dir`, whose weights are policy version `version`."""
        from vllm.v1.engine.async_llm import AsyncLLM
        check_image_processor(hf_dir)
        start = time.monotonic()
        llm = AsyncLLM.from_engine_args(engine_args(hf_dir, cfg))
        await llm.update_weight_version(str(version))
        log.info("vLLM engine up in %.1f s on %s (%s)", time.monotonic() - start, hf_dir, cfg.dtype)
        return cls(llm, cfg, sampling, version)

    # -- sampling
    async def sample(self, prompt: Prompt, *, temperature: float | None = None, seed: int | None = None) -> Sample:
        """One response to `prompt`: the exact ids, their log-probs and their version."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind
        await self._live.wait()  # a request queued during a swap would carry the old cache salt
        params = SamplingParams(
            temperature=self.sampling.temperature if temperature is None else temperature,
            max_tokens=self.sampling.max_tokens, logprobs=0, seed=seed,
            output_kind=RequestOutputKind.FINAL_ONLY)
        request = {"prompt_token_ids": prompt.placeholder_ids.tolist(), "cache_salt": f"v{self.version}"}
        if prompt.images:
            request["multi_modal_data"] = {"image": list(prompt.images)}
        out = None
        async for out in self.llm.generate(request, params, request_id=f"s{next(self._ids)}-{uuid.uuid4().hex[:8]}"):
            pass
        if len(out.prompt_token_ids) != len(prompt.token_ids) or \
                not np.array_equal(np.asarray(out.prompt_token_ids), prompt.token_ids):
            raise RuntimeError("vLLM expanded the prompt differently from the prompt builder's token ids")
        return _sample(out.outputs[0], self.version)

    # -- weights
    async def update(self, ann: WeightAnnounce, serve: WireConfig) -> SyncEvent:
        """Pull `ann`'s version beside generation, then make it live at a pause. A failed
        pull (corrupt bucket, publisher gone) leaves the engine on its old version."""
        async with self._update_lock:
            started = time.time()
            state = await self._pull(ann, serve)
            if state["state"] != "ready":
                return SyncEvent(ann.version, started, 0.0, 0.0, ok=False, error=state["error"])
            paused = time.time()
            self._live.clear()
            # `wait` drains every request, so the prefix cache can go: a request that entered
            # the queue before the pause carries the old version's salt and would otherwise
            # reuse the old weights' KV blocks after the swap (log-probs of neither policy)
            await self.llm.pause_generation(mode=self.cfg.pause, clear_cache=self.cfg.pause == "wait")
            try:
                await self.llm.collective_rpc("dart_commit_update")
                await self.llm.reset_encoder_cache()  # the scheduler's record of it, too
                await self.llm.update_weight_version(str(ann.version))
                self.version = ann.version
            finally:
                await self.llm.resume_generation()
                self._live.set()
            return SyncEvent(ann.version, started, paused, time.time(), ok=True)

    async def _pull(self, ann: WeightAnnounce, serve: WireConfig) -> dict:
        ctx = zmq.asyncio.Context()
        sock = ctx.socket(zmq.PULL)
        sock.setsockopt(zmq.LINGER, 0)
        endpoint = f"ipc:///tmp/dart-pull-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        sock.bind(endpoint)
        try:
            await self.llm.collective_rpc("dart_begin_update",
                                          args=(codec.to_bytes(ann), to_dict(serve), self.load_mode, endpoint))
            deadline = time.monotonic() + serve.timeout_s * (len(ann.buckets) + 1)
            for _ in range(self.cfg.tensor_parallel_size):  # every worker pulls the whole version
                if not await sock.poll(max(0, int((deadline - time.monotonic()) * 1000))):
                    break
                await sock.recv()
            states = await self.llm.collective_rpc("dart_update_status")
        finally:
            sock.close(0)
            ctx.term()
            Path(endpoint[len("ipc://"):]).unlink(missing_ok=True)
        failed = [s for s in states if s["state"] != "ready" or s["version"] != ann.version]
        if failed:
            await self.llm.collective_rpc("dart_abort_update")
            return {"state": "failed", "error": failed[0]["error"] or f"pull ended {failed[0]['state']}"}
        return {"state": "ready", "error": ""}

    def shutdown(self) -> None:
        self.llm.shutdown()


def _sample(completion, version: int) -> Sample:
    ids = np.asarray(completion.token_ids, np.int32)
    logprobs = np.asarray([lp[t].logprob for t, lp in zip(completion.token_ids, completion.logprobs)], np.float32)
    spans = completion.weight_versions or []
    versions = {int(s.version) for s in spans if s.end > s.start}
    first = int(spans[0].version) if spans else version
    return Sample(text=completion.text, token_ids=ids, logprobs=logprobs, policy_version=first,
                  straddles_update=len(versions) > 1)


def _on_cpu() -> bool:
    from vllm.platforms import current_platform
    return current_platform.is_cpu()
