"""One vLLM engine (AsyncLLM) serving the policy: exact samples, and new weights in place.

    engine = await Engine.start(hf_dir, cfg.engine, cfg.sampling)
    sample = await engine.sample(prompt)            # token ids, log-probs, version
    event = await engine.update(announce, weights)  # pull beside generation, swap at a pause
    engine.shutdown()

The same code drives vLLM's CUDA build on GPU hosts and its CPU build locally.

Exactness. The prompt goes in as token ids (one <|image_pad|> per image; vLLM expands
it, and the expansion is checked against the prompt builder's ids), responses come back as
the sampled ids, never re-tokenized. `logprobs_mode="processed_logprobs"`: the log-probs
of the distribution the token was drawn from, i.e. after temperature scaling, which is
what the trainer computes at the same temperature (raw log-probs would be those of
temperature 1). Prefix caching is on, salted with the policy version, so a prompt never
reuses KV computed by other weights.

A response is labelled with the version it was submitted under (its cache salt) and marked
`straddles_update` unless every token came from that version: vLLM reports the versions of
the tokens, not of the prefill or of reused KV, so a request queued or frozen mid-prefill
across an update (its tokens all new, its KV partly old) is caught by its submitted
version, one frozen while decoding by its tokens.

Updates. A version missing a tensor the model loads is refused before a byte is pulled (it
would keep old values under the new label). A failed pull leaves the engine on its old
version. A load that fails at the pause, after it may have written part of the model,
leaves the engine paused and labelled `broken` (nothing is generated under any version)
and raises EngineBroken: the worker exits and its supervisor starts a fresh engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import logging
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import zmq
import zmq.asyncio

from dart_jax.agent.prompt import Prompt
from dart_jax.config import to_dict
from dart_jax.wire import codec
from dart_jax.wire.config import WeightSyncConfig
from dart_jax.wire.messages import WeightAnnounce
from dart_jax.wire.weights import WeightTransferError, canonical_hf_name, check_tensors
from rollout_gpu.config import EngineConfig, SamplingConfig, kv_bytes_per_token
from rollout_gpu.episode import Sample
from rollout_gpu.vllm_ext import ABORT, BEGIN, COMMIT, STATUS, WeightSyncExtension

log = logging.getLogger(__name__)
EXTENSION = f"{WeightSyncExtension.__module__}.{WeightSyncExtension.__qualname__}"
PULL_GRACE_S = 30.0  # beyond the pull timeout: the worker's own deadline fires first


@dataclasses.dataclass(frozen=True)
class SyncEvent:
    """One weight update of this engine (wall-clock times)."""
    version: int
    started: float  # pull began (generation goes on)
    paused: float  # generation paused
    resumed: float  # generation resumed with the new version
    ok: bool
    error: str = ""
    pulled: float = 0.0  # every tensor received (shadow: and loaded up to the last layer)


class EngineBroken(RuntimeError):
    """A load failed after it may have written part of the model: the engine serves no
    version (paused, labelled `broken`) and must be restarted."""


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


def checkpoint_tensors(hf_dir: str | Path) -> dict[str, list[int]]:
    """name -> shape of every tensor the engine loaded from `hf_dir` (safetensors headers;
    original names; lm_head left out when the embeddings are tied): what a version must hold."""
    from safetensors import safe_open
    out = {}
    for path in sorted(Path(hf_dir).glob("*.safetensors")):
        with safe_open(str(path), "np") as f:
            out.update({canonical_hf_name(k): list(f.get_slice(k).get_shape()) for k in f.keys()})
    config = json.loads((Path(hf_dir) / "config.json").read_text())
    if config.get("tie_word_embeddings", config.get("text_config", {}).get("tie_word_embeddings", False)):
        out.pop("lm_head.weight", None)
    return out


def engine_args(hf_dir: str | Path, cfg: EngineConfig):
    """vLLM's arguments, the KV cache sized per platform (EngineConfig.kv_cache_bytes) once
    it is known to hold one `max_model_len` sequence. On CPU, prefills are never chunked:
    vLLM CPU 0.32 rewinds a seeded request's random generator after a partial prefill,
    which CPU generators cannot do (`CPU Generator does not use offset` kills the engine);
    evaluation seeds its requests."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    hf_config = json.loads((Path(hf_dir) / "config.json").read_text())
    kv_per_token = kv_bytes_per_token(hf_config, cfg.dtype, cfg.tensor_parallel_size)
    cfg.check_kv_cache(kv_per_token, str(hf_dir))
    if not _on_cpu():
        cfg.check_shadow(weight_bytes(hf_dir, cfg.dtype), _device_bytes())
    return AsyncEngineArgs(
        enable_chunked_prefill=not _on_cpu(),
        model=str(hf_dir), dtype=cfg.dtype, max_model_len=cfg.max_model_len, seed=cfg.seed,
        enforce_eager=cfg.enforce_eager, max_num_seqs=cfg.max_num_seqs,
        limit_mm_per_prompt={"image": cfg.max_images}, tensor_parallel_size=cfg.tensor_parallel_size,
        kv_cache_memory_bytes=cfg.kv_cache_bytes(kv_per_token, _on_cpu()),
        gpu_memory_utilization=cfg.gpu_memory_utilization, enable_prefix_caching=True,
        logprobs_mode="processed_logprobs", worker_extension_cls=EXTENSION)


class Engine:
    def __init__(self, llm, cfg: EngineConfig, sampling: SamplingConfig, version: int,
                 expected: dict[str, list[int]]):
        self.llm, self.cfg, self.sampling = llm, cfg, sampling
        self.version = version
        self.expected = expected  # the tensors every version must hold
        self.broken = ""  # why the engine serves no version, once a load failed half way
        self.load_mode = cfg.load if cfg.load != "auto" else ("shadow" if _on_cpu() else "inplace")
        self._ids = itertools.count()
        self._update_lock = asyncio.Lock()
        self._live = asyncio.Event()  # cleared while an update holds the engine paused
        self._live.set()
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop the engine's client runs in
        self._sockets: Path | None = None  # the engine's ipc sockets (sockets_dir), removed at shutdown

    @classmethod
    async def start(cls, hf_dir: str | Path, cfg: EngineConfig, sampling: SamplingConfig,
                    version: int = 0) -> "Engine":
        """Start the engine on `hf_dir`, whose weights are policy version `version`."""
        from vllm.v1.engine.async_llm import AsyncLLM
        check_image_processor(hf_dir)
        start = time.monotonic()
        sockets = Path(tempfile.mkdtemp(prefix="dart-vllm-", dir=os.environ.get("VLLM_RPC_BASE_PATH")))
        try:
            with sockets_dir(sockets):
                llm = AsyncLLM.from_engine_args(engine_args(hf_dir, cfg))
        except BaseException:
            shutil.rmtree(sockets, ignore_errors=True)
            raise
        await llm.update_weight_version(str(version))
        log.info("vLLM engine up in %.1f s on %s (%s)", time.monotonic() - start, hf_dir, cfg.dtype)
        engine = cls(llm, cfg, sampling, version, checkpoint_tensors(hf_dir))
        engine._loop, engine._sockets = asyncio.get_running_loop(), sockets
        return engine

    # -- sampling
    async def sample(self, prompt: Prompt, *, temperature: float | None = None, seed: int | None = None) -> Sample:
        """One response to `prompt`: the exact ids, their log-probs, the version it was
        submitted under and whether anything of it came from another version."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind
        await self._live.wait()  # a request queued during a swap would carry the old cache salt
        if self.broken:
            raise EngineBroken(self.broken)
        params = SamplingParams(
            temperature=self.sampling.temperature if temperature is None else temperature,
            max_tokens=self.sampling.max_tokens, logprobs=0, seed=seed,
            output_kind=RequestOutputKind.FINAL_ONLY)
        submitted = self.version
        request = {"prompt_token_ids": prompt.placeholder_ids.tolist(), "cache_salt": f"v{submitted}"}
        if prompt.images:
            request["multi_modal_data"] = {"image": list(prompt.images)}
        out = None
        async for out in self.llm.generate(request, params, request_id=f"s{next(self._ids)}-{uuid.uuid4().hex[:8]}"):
            pass
        if len(out.prompt_token_ids) != len(prompt.token_ids) or \
                not np.array_equal(np.asarray(out.prompt_token_ids), prompt.token_ids):
            raise RuntimeError("vLLM expanded the prompt differently from the prompt builder's token ids")
        return _sample(out.outputs[0], submitted)

    # -- weights
    async def update(self, ann: WeightAnnounce, weights: WeightSyncConfig) -> SyncEvent:
        """Pull `ann`'s version beside generation, then make it live at a pause. A refused
        version or a failed pull (corrupt bucket, publisher gone, pull timeout) leaves the
        engine on its old version; a load that fails at the pause raises EngineBroken."""
        async with self._update_lock:
            if self.broken:
                raise EngineBroken(self.broken)
            started = time.time()
            try:
                check_tensors(ann, self.expected, self.cfg.dtype)
            except WeightTransferError as e:
                return SyncEvent(ann.version, started, 0.0, 0.0, ok=False, error=f"refused: {e}")
            error, pulled = await self._pull(ann, weights)
            if error:
                return SyncEvent(ann.version, started, 0.0, 0.0, ok=False, error=error)
            paused = time.time()
            self._live.clear()
            # `wait` drains every request, so the prefix cache can go; `keep` keeps it (blocks
            # are salted by version) and marks what the update cut across
            await self.llm.pause_generation(mode=self.cfg.pause, clear_cache=self.cfg.pause == "wait")
            try:
                await self.llm.collective_rpc(COMMIT)
            except Exception as e:
                raise await self._broken(f"loading version {ann.version} failed at the pause ({type(e).__name__}: "
                                         f"{e}); the model may hold parts of versions {self.version} and "
                                         f"{ann.version}") from e
            await self.llm.reset_encoder_cache()  # the scheduler's record of it, too
            await self.llm.update_weight_version(str(ann.version))
            self.version = ann.version
            await self.llm.resume_generation()
            self._live.set()
            return SyncEvent(ann.version, started, paused, time.time(), ok=True, pulled=pulled)

    async def _broken(self, why: str) -> EngineBroken:
        """Stay paused under no version: nothing half loaded is ever sampled or labelled."""
        self.broken, self.version = why, -1
        log.error("engine broken: %s", why)
        await self.llm.update_weight_version("broken")
        self._live.set()  # requests waiting to be submitted raise EngineBroken
        return EngineBroken(why)

    async def _pull(self, ann: WeightAnnounce, weights: WeightSyncConfig) -> tuple[str, float]:
        """("", when the last tensor arrived) once every worker of the engine holds the
        version, else (why not, 0)."""
        ctx = zmq.asyncio.Context()
        sock = ctx.socket(zmq.PULL)
        sock.setsockopt(zmq.LINGER, 0)
        endpoint = f"ipc://{self._sockets or tempfile.gettempdir()}/dart-pull-{uuid.uuid4().hex[:8]}"
        sock.bind(endpoint)
        try:
            await self.llm.collective_rpc(BEGIN, args=(
                codec.to_bytes(ann), to_dict(weights.serve), self.load_mode, endpoint, weights.pull_timeout_s,
                weights.pull_depth))
            deadline = time.monotonic() + weights.pull_timeout_s + PULL_GRACE_S
            for _ in range(self.cfg.tensor_parallel_size):  # every worker pulls the whole version
                if not await sock.poll(max(0, int((deadline - time.monotonic()) * 1000))):
                    break
                await sock.recv()
            states = await self.llm.collective_rpc(STATUS)
        finally:
            sock.close(0)
            ctx.term()
            Path(endpoint[len("ipc://"):]).unlink(missing_ok=True)
        failed = [s for s in states if s["state"] != "ready" or s["version"] != ann.version]
        if failed:
            await self.llm.collective_rpc(ABORT)
            return failed[0]["error"] or f"pull of version {ann.version} not done within {weights.pull_timeout_s} s", 0.0
        return "", max(s["pulled_at"] for s in states)

    def shutdown(self) -> None:
        """Stop the engine. vLLM closes its client's sockets in a callback on the engine's
        loop; called from outside that loop (a fixture's or a benchmark's), the loop runs
        once more so they close before it does (a ZeroMQ context collected with sockets
        open blocks its process in `term`, at exit at the latest)."""
        self.llm.shutdown()
        if self._loop is not None and not self._loop.is_closed() and not self._loop.is_running():
            self._loop.run_until_complete(asyncio.sleep(0))
        if self._sockets is not None:
            shutil.rmtree(self._sockets, ignore_errors=True)


@contextlib.contextmanager
def sockets_dir(path: Path):
    """vLLM names its ipc sockets under VLLM_RPC_BASE_PATH (the temp folder by default) and
    leaves them there when it stops: about 7 files an engine, which a long-lived process (the
    `dart-jax run` supervisor's evaluations) piles up in /tmp. Set to a folder of the engine's
    own (inside the one the variable named, if any) for its start, where its client names them
    and its processes inherit it; the engine removes `path` at shutdown."""
    before = os.environ.get("VLLM_RPC_BASE_PATH")
    os.environ["VLLM_RPC_BASE_PATH"] = str(path)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("VLLM_RPC_BASE_PATH", None)
        else:
            os.environ["VLLM_RPC_BASE_PATH"] = before


def _sample(completion, submitted: int) -> Sample:
    """The completion as a step's sample, labelled with the version it was submitted under."""
    ids = np.asarray(completion.token_ids, np.int32)
    logprobs = np.asarray([lp[t].logprob for t, lp in zip(completion.token_ids, completion.logprobs)], np.float32)
    versions = {s.version for s in completion.weight_versions or [] if s.end > s.start}
    return Sample(text=completion.text, token_ids=ids, logprobs=logprobs, policy_version=submitted,
                  straddles_update=bool(versions - {str(submitted)}))


def weight_bytes(hf_dir: str | Path, dtype: str) -> int:
    """The bytes the policy's weights take in the engine's dtype (every tensor, all devices)."""
    size = 4 if dtype == "float32" else 2
    return sum(int(np.prod(shape)) for shape in checkpoint_tensors(hf_dir).values()) * size


def _device_bytes() -> int:
    import torch
    return torch.cuda.mem_get_info()[1]


def _on_cpu() -> bool:
    from vllm.platforms import current_platform
    return current_platform.is_cpu()
