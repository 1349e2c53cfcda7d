"""The worker's pull of one weight version: every trainer host's buckets at once, checked and reassembled.

    with Puller(ann, cfg.serve, timeout_s=cfg.pull_timeout_s) as pull:
        for info, data in pull: ...        # (TensorInfo, uint8 bytes) as tensors complete

`Puller` asks every host for its buckets, `depth` requests in flight per host, checks each
reply's sizes and xxh3-64 checksum before it reads a byte (`dart_jax.wire.weights`: the
format and checks the publisher shares), and reassembles the tensors (`Assembler`): a
tensor that travels as one piece is a view of the received frame, a cut one is copied block
by block into one buffer (reused across versions when the caller keeps them). No JAX and no
torch: the vLLM worker extension (`rollout_gpu.vllm_ext`) views the bytes as torch tensors
itself.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import queue
import threading
import time
from collections.abc import Iterator, Sequence

import numpy as np
import zmq

from dart_jax.wire.config import WireConfig, check_endpoint, is_loopback_endpoint
from dart_jax.wire.messages import (PieceInfo, TensorInfo, WeightAnnounce, WeightBucket, WeightBucketInfo,
                                    WeightBucketShared, WeightPull)
from dart_jax.wire.shm import Region, RegionError
from dart_jax.wire.transport import Cancelled, Client, WireTimeout
from dart_jax.wire.weights import ITEMSIZE, WeightTransferError, check_announce, check_bucket, copy_shared, few

log = logging.getLogger(__name__)
MAX_REGIONS = 16  # shared-memory regions a worker keeps mapped (a host serves keep_versions of them)


class Assembler:
    """Tensors of one version from its pieces, each returned once complete; lanes add buckets
    from several threads at once. A tensor that arrives as one received frame is a view of
    it; a cut tensor, or one whose bytes the caller will reuse (`copy`), is copied into a
    buffer of its own. `buffers` (name -> uint8 array) holds those buffers across versions:
    memory touched once is reused instead of being faulted in again on every version."""

    def __init__(self, ann: WeightAnnounce, buffers: dict[str, np.ndarray] | None = None):
        self.tensors = ann.tensors
        self.left = [math.prod(t.shape) for t in ann.tensors]
        self.buffers = {} if buffers is None else buffers
        self._lock = threading.Lock()

    def add(self, info: WeightBucketInfo, frames: Sequence[np.ndarray], copy: bool = False
            ) -> list[tuple[TensorInfo, np.ndarray]]:
        done = []
        for p, frame in zip(info.pieces, frames):
            t = self.tensors[p.tensor]
            whole = list(p.shape) == list(t.shape)
            if whole and not copy:
                done.append((t, frame))
            else:
                self._place(t, p, frame)
            with self._lock:
                self.left[p.tensor] -= math.prod(p.shape)
                complete = self.left[p.tensor] == 0
            if complete and (copy or not whole):
                done.append((t, self.buffers[t.name]))
        return done

    def _buffer(self, t: TensorInfo) -> np.ndarray:
        nbytes = math.prod(t.shape) * ITEMSIZE[t.dtype]
        with self._lock:
            buf = self.buffers.get(t.name)
            if buf is None or buf.nbytes != nbytes:
                buf = self.buffers[t.name] = np.empty(nbytes, np.uint8)
            return buf

    def _place(self, t: TensorInfo, p: PieceInfo, frame: np.ndarray) -> None:
        size = ITEMSIZE[t.dtype]
        rows = self._buffer(t).reshape(*t.shape[:-1], t.shape[-1] * size)
        index = tuple(slice(s, s + n) for s, n in zip(p.start[:-1], p.shape[:-1]))
        index += (slice(p.start[-1] * size, (p.start[-1] + p.shape[-1]) * size),)
        rows[index] = frame.reshape(*p.shape[:-1], p.shape[-1] * size)

    def missing(self) -> list[str]:
        return [t.name for t, n in zip(self.tensors, self.left) if n]


_DONE = object()


def same_machine(endpoint: str) -> bool:
    """Whether an endpoint is on this machine by its address alone (ipc, or tcp loopback)."""
    return endpoint.startswith("ipc://") or endpoint.startswith("inproc://") or is_loopback_endpoint(endpoint)


class Puller:
    """One version from its hosts: `depth` bucket requests in flight per host, each bucket
    checked, the whole pull bounded by `timeout_s`, stoppable from any thread (`stop`, or
    setting `cancel`: its threads end within a poll interval). Iterating yields (tensor, uint8 bytes) as
    tensors complete; anything wrong raises WeightTransferError, WireTimeout or RemoteError.

    A host on this machine (ipc, loopback) is asked for its buckets through shared memory
    (unless `shared` is off); a lane maps its region once (`regions`, kept across versions by the caller), copies each
    bucket into a buffer of its own, checks it there and places its pieces. A host that
    answers with bytes, or whose region cannot be used here, is pulled over the wire.

        with Puller(ann, cfg.serve, timeout_s=cfg.pull_timeout_s) as pull:
            for info, data in pull: ...
    """

    def __init__(self, ann: WeightAnnounce, wire: WireConfig, *, timeout_s: float, depth: int = 4,
                 buffers: dict[str, np.ndarray] | None = None, regions: dict[str, Region] | None = None,
                 shared: bool = True, cancel: threading.Event | None = None):
        check_announce(ann, wire.max_message_bytes)
        for endpoint in ann.hosts:  # an announcement may not send a worker anywhere its config forbids
            check_endpoint(endpoint, wire.allow_remote)
        self.ann, self.wire = ann, wire
        self.timeout_s = timeout_s
        self.deadline = time.monotonic() + timeout_s
        self.assembler = Assembler(ann, buffers)
        self.regions = {} if regions is None else regions
        for token in [t for t, region in self.regions.items() if region.unlinked()]:
            self.regions.pop(token).close()  # its trainer closed or died: let its memory go
        self.shared = [shared and same_machine(endpoint) for endpoint in ann.hosts]  # cleared for a host whose region fails
        self.cancel = threading.Event() if cancel is None else cancel
        self._items: queue.Queue = queue.Queue(maxsize=2 * depth * len(ann.hosts))
        self._ctx = zmq.Context(io_threads=min(len(ann.hosts), 8))  # one socket writer per host, up to 8
        self._todo = [iter([b for b in ann.buckets if b.host == h]) for h in range(len(ann.hosts))]
        self._lock = threading.Lock()  # the lanes' next bucket, the regions
        self._stopping = threading.Lock()  # one thread at a time closes the context
        self._lanes = [threading.Thread(target=self._lane, args=(h,), name=f"pull-v{ann.version}-h{h}", daemon=True)
                       for h in range(len(ann.hosts)) for _ in range(depth)]

    def __enter__(self) -> "Puller":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __iter__(self) -> Iterator[tuple[TensorInfo, np.ndarray]]:
        for lane in self._lanes:
            lane.start()
        running = len(self._lanes)
        try:
            while running:
                item = self._get()
                if item is _DONE:
                    running -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield from item
        finally:
            self.stop()
        if missing := self.assembler.missing():
            raise WeightTransferError(f"version {self.ann.version}: incomplete after every bucket: {few(missing)}")

    def _get(self):
        while True:
            if self.cancel.is_set():
                raise Cancelled(f"the pull of version {self.ann.version} was stopped")
            try:
                return self._items.get(timeout=0.1)
            except queue.Empty:
                if time.monotonic() > self.deadline + 1.0:  # the lanes time out first
                    raise WeightTransferError(f"version {self.ann.version}: pull timed out") from None

    def _lane(self, host: int) -> None:
        wire = dataclasses.replace(self.wire, endpoint=self.ann.hosts[host])
        staging = np.empty(0, np.uint8)  # this lane's copy of a shared bucket, reused
        try:
            with Client(wire, ctx=self._ctx) as client:
                while (info := self._next(host)) is not None:
                    reply = self._request(client, info, self.shared[host])
                    if isinstance(reply, WeightBucketShared):
                        try:
                            region = self._region(reply)
                        except RegionError as e:
                            log.warning("host %d: weights over the wire instead of shared memory: %s", host, e)
                            self.shared[host] = False
                            reply = self._request(client, info, False)
                        else:
                            if staging.nbytes < info.nbytes:
                                staging = np.empty(info.nbytes, np.uint8)
                            frames = copy_shared(info, reply, region, staging, self.ann)
                            self._put(self.assembler.add(info, frames, copy=True))
                            continue
                    if not isinstance(reply, WeightBucket):
                        raise WeightTransferError(f"a WeightPull answered with {type(reply).__name__}")
                    self._put(self.assembler.add(info, check_bucket(info, reply, self.ann)))
        except Cancelled:
            return
        except Exception as e:  # handed to the consumer, which stops every lane
            self._put(e)
        self._put(_DONE)

    def _request(self, client: Client, info: WeightBucketInfo, shared: bool):
        left = self.deadline - time.monotonic()
        try:
            if left <= 0:
                raise WireTimeout("no time left")
            return client.request(WeightPull(version=self.ann.version, bucket=info.index, shared=shared),
                                  min(client.cfg.timeout_s, left), cancel=self.cancel)
        except WireTimeout:
            if time.monotonic() < self.deadline:
                raise  # the host did not answer within serve.timeout_s
            raise WeightTransferError(f"version {self.ann.version}: not pulled within the pull "
                                      f"timeout ({self.timeout_s:g} s)") from None

    def _region(self, reply: WeightBucketShared) -> Region:
        with self._lock:
            region = self.regions.get(reply.token)
            if region is None:
                region = Region.open(reply.region, reply.token)
                for token in list(self.regions)[:max(0, len(self.regions) - MAX_REGIONS + 1)]:
                    self.regions.pop(token).close()
                self.regions[reply.token] = region
            return region

    def _next(self, host: int) -> WeightBucketInfo | None:
        with self._lock:
            return None if self.cancel.is_set() else next(self._todo[host], None)

    def _put(self, item) -> None:
        while not self.cancel.is_set():
            try:
                return self._items.put(item, timeout=0.1)
            except queue.Full:
                continue

    def stop(self) -> None:
        """End every lane (each within a poll interval) and wait for them; any thread may call it."""
        self.cancel.set()
        with self._stopping:
            for lane in self._lanes:
                if lane.is_alive():
                    lane.join()
            if not self._ctx.closed:
                self._ctx.term()
