"""Weight versions on the wire: pieces, buckets, checks, and the worker-side puller.

A version is a list of Hugging Face-named, torch-layout tensors. Each trainer host serves
the blocks of them it holds (its shards, converted on its devices), so no host gathers
what it does not serve. A block larger than a bucket is cut into rows (`split_block`), so
no message exceeds the limit whatever the tensor; a piece is one such block or row range,
and a bucket is a run of one host's pieces (`pack_buckets`). The announcement lists every
tensor and every bucket's host and pieces; `check_announce` refuses one whose pieces do not
tile every tensor exactly, `check_tensors` one that lacks a tensor the model needs.

The worker pulls every host's buckets at once, `depth` requests in flight per host
(`Puller`), checks each reply's sizes and xxh3-64 checksum before it reads a byte
(`check_bucket`), and reassembles the tensors (`Assembler`): a tensor that travels as one
piece is a view of the received frame, a cut one is copied block by block into one buffer
(reused across versions when the caller keeps them). No JAX and no torch: the vLLM worker
views the bytes as torch tensors itself.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import queue
import threading
import time
from collections.abc import Iterator, Mapping, Sequence

import numpy as np
import xxhash
import zmq

from dart_jax.wire.codec import MAX_FRAMES
from dart_jax.wire.config import WireConfig, check_endpoint, is_loopback_endpoint
from dart_jax.wire.messages import (PieceInfo, TensorInfo, WeightAnnounce, WeightBucket, WeightBucketInfo,
                                    WeightBucketShared, WeightPull)
from dart_jax.wire.shm import Region, RegionError
from dart_jax.wire.transport import Cancelled, Client, WireTimeout

log = logging.getLogger(__name__)
ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}
MAX_PIECES_PER_TENSOR = 4096  # the exact-cover check is quadratic in them
HEADER_BYTES = 2**20  # room left in a message for the header beside a bucket's bytes
MAX_REGIONS = 16  # shared-memory regions a worker keeps mapped (a host serves keep_versions of them)


def canonical_hf_name(name: str) -> str:
    """The name a version carries (the original checkpoints') for a name written by either
    naming scheme (transformers 5 saves `model.language_model.*` and `model.visual.*`)."""
    if name.startswith("model.language_model."):
        return "model." + name[len("model.language_model.") :]
    if name.startswith("model.visual."):
        return name[len("model.") :]
    return name


class WeightTransferError(Exception):
    """A version, bucket or pull that must not be loaded (corrupt, incomplete, mismatched)."""


def split_block(start: Sequence[int], shape: Sequence[int], itemsize: int,
                limit: int) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """(start, shape) of row ranges of a block, each at most `limit` bytes and each a
    contiguous range of the block's C-order bytes (a row larger than `limit` is cut the
    same way along the next dimension)."""
    start, shape = tuple(start), tuple(shape)
    if not shape or math.prod(shape) * itemsize <= limit:
        return [(start, shape)]
    row = math.prod(shape[1:]) * itemsize
    if row > limit:
        return [((start[0] + r,) + s, (1,) + sh) for r in range(shape[0])
                for s, sh in split_block(start[1:], shape[1:], itemsize, limit)]
    rows = limit // row
    return [((start[0] + r,) + start[1:], (min(rows, shape[0] - r),) + shape[1:]) for r in range(0, shape[0], rows)]


def piece_bytes(piece: PieceInfo, tensors: Sequence[TensorInfo]) -> int:
    return math.prod(piece.shape) * ITEMSIZE[tensors[piece.tensor].dtype]


def pack_buckets(host_pieces: Sequence[Sequence[PieceInfo]], tensors: Sequence[TensorInfo],
                 bucket_bytes: int) -> list[WeightBucketInfo]:
    """Every host's pieces (in tensor order) in runs of at most `bucket_bytes`, numbered
    by the tensor they start with, so pulling each host's buckets in order completes the
    tensors roughly in order."""
    runs = []
    for host, pieces in enumerate(host_pieces):
        run, size = [], 0
        for p in pieces:
            n = piece_bytes(p, tensors)
            if run and (size + n > bucket_bytes or len(run) == MAX_FRAMES - 2):
                runs.append((host, run, size))
                run, size = [], 0
            run.append(p)
            size += n
        if run:
            runs.append((host, run, size))
    runs.sort(key=lambda r: (r[1][0].tensor, r[0]))
    return [WeightBucketInfo(index=i, host=h, nbytes=n, pieces=list(run)) for i, (h, run, n) in enumerate(runs)]


def checksum(frames: Sequence) -> int:
    """xxh3-64 of the frames' bytes, in order (tens of GB/s: the check costs no time)."""
    h = xxhash.xxh3_64()
    for f in frames:
        h.update(f)
    return h.intdigest()


# ---- checks ---------------------------------------------------------------------------

def check_announce(ann: WeightAnnounce, max_message_bytes: int) -> None:
    """Raise WeightTransferError unless the buckets are numbered 0..n-1, each names a host,
    fits a message and adds up, and the pieces tile every tensor exactly (inside it, no
    overlap, every element once)."""
    v = f"version {ann.version}"
    if not ann.hosts:
        raise WeightTransferError(f"{v}: no host serves it")
    if len({t.name for t in ann.tensors}) != len(ann.tensors):
        raise WeightTransferError(f"{v}: a tensor is listed twice")
    if [b.index for b in ann.buckets] != list(range(len(ann.buckets))):
        raise WeightTransferError(f"{v}: buckets not numbered 0..{len(ann.buckets) - 1}")
    blocks: list[list[PieceInfo]] = [[] for _ in ann.tensors]
    for b in ann.buckets:
        _check_bucket_info(ann, b, max_message_bytes)
        for p in b.pieces:
            blocks[p.tensor].append(p)
    if sum(b.nbytes for b in ann.buckets) != ann.total_bytes:
        raise WeightTransferError(f"{v}: bucket sizes do not add up to {ann.total_bytes}")
    for t, pieces in zip(ann.tensors, blocks):
        _check_cover(v, t, pieces)


def _check_bucket_info(ann: WeightAnnounce, b: WeightBucketInfo, max_message_bytes: int) -> None:
    where = f"version {ann.version} bucket {b.index}"
    if b.host >= len(ann.hosts) or not b.pieces or len(b.pieces) >= MAX_FRAMES:
        raise WeightTransferError(f"{where}: host {b.host} of {len(ann.hosts)}, {len(b.pieces)} pieces")
    for p in b.pieces:
        if p.tensor >= len(ann.tensors):
            raise WeightTransferError(f"{where}: piece of tensor {p.tensor}, the version has {len(ann.tensors)}")
        t = ann.tensors[p.tensor]
        if not (len(p.start) == len(p.shape) == len(t.shape)) or \
                any(n < 1 or s + n > d for s, n, d in zip(p.start, p.shape, t.shape)):
            raise WeightTransferError(f"{where}: block {p.start}+{p.shape} does not lie in {t.name} {t.shape}")
    if sum(piece_bytes(p, ann.tensors) for p in b.pieces) != b.nbytes:
        raise WeightTransferError(f"{where}: pieces do not add up to {b.nbytes} bytes")
    if b.nbytes > max_message_bytes - HEADER_BYTES:
        raise WeightTransferError(f"{where}: {b.nbytes} bytes do not fit a message of {max_message_bytes}")


def _check_cover(version: str, t: TensorInfo, pieces: list[PieceInfo]) -> None:
    if len(pieces) > MAX_PIECES_PER_TENSOR:
        raise WeightTransferError(f"{version}: {t.name} comes in {len(pieces)} pieces "
                                  f"(at most {MAX_PIECES_PER_TENSOR}; raise bucket_mb)")
    if sum(math.prod(p.shape) for p in pieces) != math.prod(t.shape):
        raise WeightTransferError(f"{version}: the pieces of {t.name} cover {sum(math.prod(p.shape) for p in pieces)}"
                                  f" of its {math.prod(t.shape)} elements")
    if len(pieces) > 1:
        lo = np.asarray([p.start for p in pieces], np.int64)
        hi = lo + np.asarray([p.shape for p in pieces], np.int64)
        for i in range(len(pieces) - 1):  # blocks overlap when their ranges overlap in every dimension
            if (np.maximum(lo[i], lo[i + 1:]) < np.minimum(hi[i], hi[i + 1:])).all(axis=1).any():
                raise WeightTransferError(f"{version}: pieces of {t.name} overlap")


def check_tensors(ann: WeightAnnounce, expected: Mapping[str, Sequence[int]], dtype: str) -> None:
    """Raise WeightTransferError unless the version holds exactly the tensors the model
    loads (`expected`: name -> shape), in the engine's `dtype`: a missing tensor would keep
    its old values under the new version's label."""
    got = {t.name: t for t in ann.tensors}
    missing, extra = sorted(set(expected) - set(got)), sorted(set(got) - set(expected))
    if missing or extra:
        raise WeightTransferError(f"version {ann.version}: missing {_few(missing)}, unexpected {_few(extra)}")
    for name, shape in expected.items():
        t = got[name]
        if list(t.shape) != list(shape) or t.dtype != dtype:
            raise WeightTransferError(f"version {ann.version}: {name} is {t.dtype} {t.shape}, "
                                      f"the engine loads {dtype} {list(shape)}")


def _few(names: list[str]) -> str:
    return "none" if not names else ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _check_asked(info: WeightBucketInfo, reply: WeightBucket | WeightBucketShared, ann: WeightAnnounce) -> None:
    if reply.version != ann.version or reply.bucket != info.index:
        raise WeightTransferError(f"asked for version {ann.version} bucket {info.index}, "
                                  f"got version {reply.version} bucket {reply.bucket}")


def check_bucket(info: WeightBucketInfo, reply: WeightBucket, ann: WeightAnnounce) -> list[np.ndarray]:
    """The bucket's frames, once they are the announced pieces of this version, whole and intact."""
    _check_asked(info, reply, ann)
    where = f"version {ann.version} bucket {info.index}"
    if len(reply.pieces) != len(info.pieces):
        raise WeightTransferError(f"{where}: {len(reply.pieces)} pieces, expected {len(info.pieces)}")
    for frame, p in zip(reply.pieces, info.pieces):
        if frame.dtype != np.uint8 or frame.ndim != 1 or frame.nbytes != piece_bytes(p, ann.tensors):
            raise WeightTransferError(f"{where}: a piece of {frame.nbytes} bytes, expected {piece_bytes(p, ann.tensors)}")
    if checksum(reply.pieces) != reply.checksum:
        raise WeightTransferError(f"{where}: checksum mismatch (corrupt bucket)")
    return reply.pieces


def copy_shared(info: WeightBucketInfo, reply: WeightBucketShared, region: Region, staging: np.ndarray,
                ann: WeightAnnounce) -> list[np.ndarray]:
    """The bucket's pieces, copied out of the host's region into `staging` and checked there:
    the bytes returned are the ones checked, whatever the region holds afterwards."""
    _check_asked(info, reply, ann)
    if reply.offset + info.nbytes > region.size:
        raise WeightTransferError(f"version {ann.version} bucket {info.index}: {info.nbytes} bytes at "
                                  f"{reply.offset} lie outside its region ({region.size} bytes)")
    out = staging[:info.nbytes]
    out[:] = region.data[reply.offset:reply.offset + info.nbytes]
    if checksum([out]) != reply.checksum:
        raise WeightTransferError(f"version {ann.version} bucket {info.index}: checksum mismatch "
                                  "(a corrupt bucket, or its region reused by a later version)")
    sizes = np.cumsum([0] + [piece_bytes(p, ann.tensors) for p in info.pieces])
    return [out[a:b] for a, b in zip(sizes[:-1], sizes[1:])]


# ---- reassembly -----------------------------------------------------------------------

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


# ---- the worker-side pull -------------------------------------------------------------

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
            raise WeightTransferError(f"version {self.ann.version}: incomplete after every bucket: {_few(missing)}")

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
