"""The vLLM worker extension that takes new weights in place (`worker_extension_cls`).

The one file that reaches into vLLM's internals. Driven by `rollout_gpu.engine` through
`collective_rpc`:

    dart_begin_update(announce, serve, mode, notify, timeout_s, depth)
                                               start pulling a version on a background thread;
                                               `notify` (a ZeroMQ endpoint) hears when it ends
    dart_update_status()                       {"state": "idle|pulling|ready|failed", ...} (`PullJob.status`)
    dart_commit_update()                       at a pause: make the pulled version live
    dart_abort_update()                        stop a pull (its threads end) or drop a pulled version

The engine calls them by the names this module exports (`BEGIN`, `STATUS`, `COMMIT`, `ABORT`:
vLLM dispatches by method name); the version in flight is a `PullJob`.

The pull runs beside the engine, which keeps generating: `rollout_gpu.pull.Puller` fetches
every trainer host's buckets at once (through shared memory from a host on this machine
that offers it), checks each before a byte of it is read and reassembles the tensors
(buffers and mapped regions kept across versions), within `timeout_s`. Two ways to load, by `mode`:

- `shadow` (the CPU default): the checked tensors go through vLLM's own loader
  (`model.load_weights`, so vLLM fuses qkv / gate_up and slices for tensor parallelism)
  into a structural clone of the model, vLLM's layerwise-reload machinery re-running each
  layer's kernel processing (on CPU the oneDNN weight packing that makes a plain in-place
  copy impossible). At the commit each live module takes its clone's tensors and kernel
  handles: a pause of milliseconds, whatever the model size. Costs one extra copy of the
  weights; the tensors the live model gives up become the next clone's storage, so an
  update writes into memory already touched instead of faulting in new pages.
- `inplace` (the GPU default): the checked tensors are kept in host memory, and the
  commit runs vLLM's `reload_weights` with them (its layerwise in-place reload, which
  writes into the live tensors: CUDA graphs stay valid), so the pause is one load at
  device bandwidth and no second copy of the weights is held.

Anything wrong (a corrupt or missing bucket, a publisher that stops answering, the pull
timeout) fails the pull; the live model is never touched before the commit, so the engine
keeps serving its old version. Why not vLLM's pluggable weight-transfer engine
(`update_weights`): it receives on the worker's main thread inside the RPC, so transfer and
repacking would stall generation, and it loads tensors as they arrive, before the whole
version is known good.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import os
import threading
import time
import warnings
from types import MethodType
from typing import Iterator, Literal

import numpy as np
import torch
import zmq

from dart_jax.config import from_dict
from dart_jax.wire import codec
from dart_jax.wire.config import WireConfig
from dart_jax.wire.messages import TensorInfo, WeightAnnounce
from rollout_gpu.pull import Puller

log = logging.getLogger(__name__)
_TORCH = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
ABORT_WAIT_S = 60.0  # a stopped pull ends at its next tensor; a layer's processing bounds it


def as_tensors(pulled: Iterator[tuple[TensorInfo, np.ndarray]]) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, tensor) views of the pulled bytes (read-only frames or reused buffers):
    loaders copy from them."""
    for info, data in pulled:
        with warnings.catch_warnings():  # a received frame is read-only; nothing writes to it
            warnings.simplefilter("ignore", UserWarning)
            flat = torch.frombuffer(data, dtype=_TORCH[info.dtype]) if data.nbytes else torch.empty(0, dtype=_TORCH[info.dtype])
        yield info.name, flat.view(info.shape)


# ---- shadow loading ------------------------------------------------------------------

Spare = dict[tuple[torch.nn.Module, str], torch.Tensor]  # (live module, name) -> storage it gave up


def _fresh(tensor: torch.Tensor, spare: torch.Tensor | None) -> torch.Tensor:
    """A copy in storage the live model does not use (`spare` when it fits), of the same
    class and attributes (weight loaders). Values are copied too: a layer the checkpoint
    does not cover (constant buffers such as the vision input normalization) keeps them
    through the reload."""
    if spare is not None and spare.shape == tensor.shape and spare.dtype == tensor.dtype \
            and spare.device == tensor.device and spare.is_contiguous() and tensor.is_contiguous():
        out = spare.detach()
        out.copy_(tensor.detach())
    else:
        out = tensor.detach().clone()
    out.__class__ = tensor.__class__
    out.__dict__ = tensor.__dict__.copy()
    return out


def _own_meta(tensor: torch.Tensor, live: torch.nn.Module) -> torch.Tensor:
    """A copy of one of vLLM's reload-metadata tensors (on the meta device) for a clone.
    vLLM binds and wraps the weight loaders of these tensors in place, so a clone sharing
    them would leave the live module's loaders pointing at the clone, and a clone copying
    them as they are would send its weights to the live module's loader wrapper."""
    from vllm.model_executor.model_loader.reload.layerwise import _get_original_loader
    from vllm.model_executor.model_loader.reload.sanitize import layer_ref_sentinel

    out = tensor.detach().clone()
    out.__class__ = tensor.__class__
    out.__dict__ = dict(tensor.__dict__)
    if hasattr(tensor, "weight_loader"):  # a property of vLLM's parameter classes
        out.weight_loader = _get_original_loader(tensor)
    for key, value in out.__dict__.items():
        if isinstance(value, MethodType) and value.__self__ is live:
            out.__dict__[key] = value.__func__.__get__(layer_ref_sentinel)
    return out


def clone_modules(model: torch.nn.Module, spare: Spare | None = None) -> dict[torch.nn.Module, torch.nn.Module]:
    """live module -> clone: the same tree (shared submodules stay shared), the same
    attributes, copies of every parameter and persistent buffer in storage the live model
    does not use (`spare`'s where it fits), and its own copy of vLLM's reload metadata, so
    a layerwise reload of the clone never writes to anything the live model uses."""
    from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO, get_layerwise_info
    from vllm.model_executor.model_loader.reload.types import LayerReloadingInfo

    pairs: dict[torch.nn.Module, torch.nn.Module] = {}

    def clone(m: torch.nn.Module) -> torch.nn.Module:
        if m in pairs:
            return pairs[m]
        c = pairs[m] = copy.copy(m)
        c._parameters = {n: None if p is None else _fresh(p, spare.pop((m, n), None)) for n, p in m._parameters.items()}
        c._buffers = {n: b if b is None or n in m._non_persistent_buffers_set else _fresh(b, spare.pop((m, n), None))
                      for n, b in m._buffers.items()}
        c._non_persistent_buffers_set = set(m._non_persistent_buffers_set)
        c._modules = {n: None if s is None else clone(s) for n, s in m._modules.items()}
        live = get_layerwise_info(m)
        params, buffers = live.restore_metadata
        LAYERWISE_INFO[c] = LayerReloadingInfo(
            restore_metadata=({n: _own_meta(t, m) for n, t in params.items()},
                              {n: _own_meta(t, m) for n, t in buffers.items()}),
            restore_device=live.restore_device)
        return c

    spare = {} if spare is None else spare
    clone(model)
    return pairs


def load_shadow(model: torch.nn.Module, weights: Iterator[tuple[str, torch.Tensor]], model_config,
                spare: Spare | None = None) -> dict:
    """The clones of `model`'s modules with `weights` loaded and processed."""
    from vllm.model_executor.model_loader.reload.layerwise import (finalize_layerwise_reload,
                                                                   initialize_layerwise_reload)
    pairs = clone_modules(model, spare)
    root = pairs[model]
    with torch.no_grad():
        initialize_layerwise_reload(root)
        root.load_weights(weights)
        finalize_layerwise_reload(root, model_config)
    return pairs


def swap_in(pairs: dict[torch.nn.Module, torch.nn.Module]) -> Spare:
    """Each live module takes its clone's attributes (tensors, kernel handles) but keeps
    its own identity and children, so every reference the engine holds stays valid.
    Returns the tensors the live modules gave up: the next clone's storage."""
    spare: Spare = {}
    for live, shadow in pairs.items():
        for kind in ("_parameters", "_buffers"):
            spare.update({(live, n): t.data for n, t in live.__dict__[kind].items() if t is not None})
        children = live.__dict__["_modules"]
        live.__dict__.clear()
        live.__dict__.update(shadow.__dict__)
        live.__dict__["_modules"] = children
    return spare


def _unpin_this_thread() -> None:
    """Let the pull run on every core the engine process may use: vLLM's CPU backend pins
    its worker (all its threads, by inheritance) to the cores of its OpenMP team, where the
    pull would take turns with generation."""
    with contextlib.suppress(OSError, AttributeError):
        os.sched_setaffinity(0, os.sched_getaffinity(os.getppid()))


@dataclasses.dataclass
class PullJob:
    """One version pulled beside generation on its own thread (`thread`, stopped through
    `cancel`), then held until the commit makes it live or an abort drops it. The pull thread
    advances `state` and the times; the engine's RPCs read them (`status`)."""
    version: int
    mode: Literal["shadow", "inplace"]
    thread: threading.Thread | None = None
    cancel: threading.Event = dataclasses.field(default_factory=threading.Event)
    state: Literal["pulling", "ready", "failed"] = "pulling"
    error: str = ""
    started: float = dataclasses.field(default_factory=time.time)
    pulled_at: float = 0.0  # the last tensor arrived (shadow: and was loaded up to its layer)
    ready_at: float = 0.0
    result: object = None  # shadow: the loaded clones (`load_shadow`); inplace: the checked tensors

    def status(self) -> dict:
        """What `dart_update_status` answers: a plain dict, as it crosses vLLM's RPC."""
        return {"state": self.state, "version": self.version, "error": self.error, "mode": self.mode,
                "started": self.started, "pulled_at": self.pulled_at, "ready_at": self.ready_at}

    def stamped(self, tensors: Iterator) -> Iterator:
        """`tensors`, stamping `pulled_at` when the last one has arrived."""
        yield from tensors
        self.pulled_at = time.time()


def _notify(endpoint: str, version: int) -> None:
    ctx = zmq.Context()
    try:
        sock = ctx.socket(zmq.PUSH)
        sock.setsockopt(zmq.LINGER, 1000)
        sock.connect(endpoint)
        sock.send(str(version).encode())
        sock.close()
    finally:
        ctx.term()


# ---- the extension -------------------------------------------------------------------

class WeightSyncExtension:
    """Mixed into vLLM's worker class; `self` is the worker (model_runner, vllm_config)."""

    def dart_begin_update(self, announce: bytes, serve: dict, mode: str, notify: str, timeout_s: float,
                          depth: int) -> None:
        """Returns at once. Polling the status instead of waiting on `notify` would keep the
        worker's main thread spinning on vLLM's message queue (it busy-loops for a second
        after each message) and starve the pull of the interpreter lock."""
        self.dart_abort_update()
        ann = codec.from_bytes(announce, WeightAnnounce)
        wire = from_dict(WireConfig, serve, "weight serve config")
        job = self._dart = PullJob(ann.version, mode)
        job.thread = threading.Thread(target=self._dart_pull, args=(ann, wire, job, notify, timeout_s, depth),
                                      name=f"dart-pull-v{ann.version}", daemon=True)
        job.thread.start()

    def _dart_pull(self, ann: WeightAnnounce, wire: WireConfig, job: PullJob, notify: str, timeout_s: float,
                   depth: int) -> None:
        _unpin_this_thread()
        buffers = self.__dict__.setdefault("_dart_buffers", {})
        regions = self.__dict__.setdefault("_dart_regions", {})
        try:
            with Puller(ann, wire, timeout_s=timeout_s, depth=depth, buffers=buffers, regions=regions,
                        cancel=job.cancel) as pull:
                tensors = job.stamped(as_tensors(iter(pull)))
                if job.mode == "shadow":
                    result = load_shadow(self.model_runner.get_model(), tensors, self.vllm_config.model_config,
                                         self.__dict__.pop("_dart_spare", None))
                else:  # keep the checked bytes; the tensors view them
                    result = list(tensors)
            job.result, job.state, job.ready_at = result, "ready", time.time()
        except Exception as e:  # contained: the live model is untouched; the engine serves on
            log.warning("weight version %d not loaded: %s: %s", ann.version, type(e).__name__, e)
            job.state, job.error, job.result = "failed", f"{type(e).__name__}: {e}", None
        _notify(notify, job.version)

    def dart_update_status(self) -> dict:
        """The pull's state, and how many pull threads run in this process (0 once stopped)."""
        threads = sum(t.name.startswith(("dart-pull-", "pull-v")) for t in threading.enumerate())
        job = getattr(self, "_dart", None)
        if job is None:
            return {"state": "idle", "version": -1, "error": "", "threads": threads}
        return job.status() | {"threads": threads}

    def dart_commit_update(self) -> dict:
        """Make the pulled version live (the engine is paused); returns the load time. An
        inplace load that raises may have written part of the model: the caller must not
        serve it under any version."""
        job = getattr(self, "_dart", None)
        if job is None or job.state != "ready":
            raise RuntimeError(f"no pulled version to commit ({None if job is None else job.state})")
        self._dart = None
        start = time.perf_counter()
        if job.mode == "shadow":
            self._dart_spare = swap_in(job.result)
        else:
            self.reload_weights(weights_iterator=iter(job.result))
        self.model_runner.reset_encoder_cache()
        self.model_runner.reset_mm_cache()
        return {"version": job.version, "load_s": time.perf_counter() - start}

    def dart_abort_update(self) -> bool:
        """Stop the pull in flight, wait for its thread, drop what it pulled; False when the
        thread is still inside one layer's processing after ABORT_WAIT_S."""
        job, self._dart = getattr(self, "_dart", None), None
        if job is None:
            return True
        job.cancel.set()
        job.thread.join(ABORT_WAIT_S)
        return not job.thread.is_alive()


# the names the engine calls through vLLM's `collective_rpc`, which dispatches by method name
BEGIN, STATUS, COMMIT, ABORT = (m.__name__ for m in (
    WeightSyncExtension.dart_begin_update, WeightSyncExtension.dart_update_status,
    WeightSyncExtension.dart_commit_update, WeightSyncExtension.dart_abort_update))
