"""Weight transfer between the trainer and the rollout workers: config, buckets, checks.

A published version is a list of buckets; a bucket is the raw bytes of several Hugging
Face-named, torch-layout tensors back to back (`pack_bucket`), described by a
`WeightBucketInfo` (each tensor's name, dtype, shape and byte range, and a CRC-32 of the
whole bucket). The receiver checks sizes and the CRC before it reads a single tensor
(`check_bucket`), so a corrupt or truncated bucket never reaches the model. No JAX and no
torch here: the trainer packs numpy arrays, the vLLM worker views the bytes as torch
tensors itself (`bfloat16` has no numpy dtype without ml_dtypes).
"""

from __future__ import annotations

import dataclasses
import zlib
from typing import Iterable, Sequence

import numpy as np

from dart_jax.config import bounded
from dart_jax.wire.config import WireConfig
from dart_jax.wire.messages import TensorInfo, WeightAnnounce, WeightBucket, WeightBucketInfo

DTYPES = ("float32", "bfloat16", "float16")
_ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclasses.dataclass(frozen=True)
class WeightSyncConfig:
    """Where the trainer announces versions (PUB) and serves their buckets (ROUTER);
    rollout workers connect to both. `dtype` is what travels and what the engine loads:
    it must be the rollout engine's dtype (the run config checks)."""
    announce: WireConfig = WireConfig(endpoint="tcp://127.0.0.1:5560")
    serve: WireConfig = WireConfig(endpoint="tcp://127.0.0.1:5561")
    dtype: str = "float32"
    bucket_mb: int = bounded(64, ge=1)
    keep_versions: int = bounded(2, ge=1)  # versions served at once (a slow puller finishes)
    reannounce_s: float = bounded(2.0, gt=0)  # PUB drops what slow joiners missed
    pull_timeout_s: float = bounded(60.0, gt=0)  # one bucket

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r}: one of {DTYPES}")
        if self.bucket_mb * 2**20 > self.serve.max_message_bytes - 2**20:
            raise ValueError(f"bucket_mb {self.bucket_mb} does not fit serve.max_message_bytes "
                             f"{self.serve.max_message_bytes} (leave 1 MiB for the header)")


class WeightTransferError(Exception):
    """A bucket or announcement that must not be loaded (corrupt, missing, mismatched)."""


def pack_bucket(index: int, tensors: Sequence[tuple[str, np.ndarray]], dtype: str) -> tuple[WeightBucketInfo, np.ndarray]:
    """(manifest entry, uint8 bytes) of tensors already in `dtype`, back to back."""
    infos, offset = [], 0
    for name, x in tensors:
        if x.dtype.name != dtype:
            raise ValueError(f"{name}: dtype {x.dtype.name}, the bucket carries {dtype}")
        infos.append(TensorInfo(name=name, dtype=dtype, shape=list(x.shape), offset=offset, nbytes=x.nbytes))
        offset += x.nbytes
    data = np.empty(offset, np.uint8)
    for info, (_, x) in zip(infos, tensors):
        data[info.offset:info.offset + info.nbytes] = np.ascontiguousarray(x).reshape(-1).view(np.uint8)
    return WeightBucketInfo(index=index, nbytes=offset, crc32=zlib.crc32(data), tensors=infos), data


def check_announce(ann: WeightAnnounce) -> None:
    """Raise WeightTransferError unless every tensor lies inside its bucket and matches
    its dtype and shape, buckets are numbered 0..n-1, and the sizes add up."""
    if [b.index for b in ann.buckets] != list(range(len(ann.buckets))):
        raise WeightTransferError(f"version {ann.version}: buckets not numbered 0..{len(ann.buckets) - 1}")
    if sum(b.nbytes for b in ann.buckets) != ann.total_bytes:
        raise WeightTransferError(f"version {ann.version}: bucket sizes do not add up to {ann.total_bytes}")
    for b in ann.buckets:
        end = 0
        for t in b.tensors:
            want = int(np.prod(t.shape, dtype=np.int64)) * _ITEMSIZE[t.dtype]
            if any(d < 0 for d in t.shape) or t.nbytes != want or t.offset != end:
                raise WeightTransferError(f"version {ann.version} bucket {b.index}: tensor {t.name} "
                                          f"has {t.nbytes} bytes at {t.offset}, expected {want} at {end}")
            end += t.nbytes
        if end != b.nbytes:
            raise WeightTransferError(f"version {ann.version} bucket {b.index}: tensors cover {end} of {b.nbytes} bytes")


def check_bucket(info: WeightBucketInfo, reply: WeightBucket, version: int) -> np.ndarray:
    """The bucket's bytes, once they are the announced bucket of `version`, whole and intact."""
    if reply.version != version or reply.bucket != info.index:
        raise WeightTransferError(f"asked for version {version} bucket {info.index}, "
                                  f"got version {reply.version} bucket {reply.bucket}")
    data = reply.data
    if data.dtype != np.uint8 or data.ndim != 1 or data.nbytes != info.nbytes:
        raise WeightTransferError(f"version {version} bucket {info.index}: {data.nbytes} bytes, expected {info.nbytes}")
    if zlib.crc32(data) != info.crc32:
        raise WeightTransferError(f"version {version} bucket {info.index}: CRC-32 mismatch (corrupt bucket)")
    return data


def tensor_names(ann: WeightAnnounce) -> Iterable[str]:
    return (t.name for b in ann.buckets for t in b.tensors)
