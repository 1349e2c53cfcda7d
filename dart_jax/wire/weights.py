"""Weight versions on the wire: pieces, buckets and their checks, what both ends need.

A version is a list of Hugging Face-named, torch-layout tensors. Each trainer host serves
the blocks of them it holds (its shards, converted on its devices), so no host gathers
what it does not serve. A block larger than a bucket is cut into rows (`split_block`), so
no message exceeds the limit whatever the tensor; a piece is one such block or row range,
and a bucket is a run of one host's pieces (`pack_buckets`). The announcement lists every
tensor and every bucket's host and pieces; `check_announce` refuses one whose pieces do not
tile every tensor exactly, `check_tensors` one that lacks a tensor the model needs. Each
bucket carries an xxh3-64 checksum of its bytes (`checksum`); a worker checks each reply's
sizes and checksum before it reads a byte (`check_bucket`, `copy_shared` for one taken
through shared memory).

The trainer side lays versions out and serves them (`dart_jax.train.layout`,
`dart_jax.train.publish`); the worker side pulls and reassembles them (`rollout_gpu.pull`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import xxhash

from dart_jax.wire.codec import MAX_FRAMES
from dart_jax.wire.messages import (PieceInfo, TensorInfo, WeightAnnounce, WeightBucket, WeightBucketInfo,
                                    WeightBucketShared)
from dart_jax.wire.shm import Region

ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}
MAX_PIECES_PER_TENSOR = 4096  # the exact-cover check is quadratic in them
HEADER_BYTES = 2**20  # room left in a message for the header beside a bucket's bytes


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
        raise WeightTransferError(f"version {ann.version}: missing {few(missing)}, unexpected {few(extra)}")
    for name, shape in expected.items():
        t = got[name]
        if list(t.shape) != list(shape) or t.dtype != dtype:
            raise WeightTransferError(f"version {ann.version}: {name} is {t.dtype} {t.shape}, "
                                      f"the engine loads {dtype} {list(shape)}")


def few(names: list[str]) -> str:
    """The first three names, and how many more (for error messages)."""
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
