"""A version's layout: which tensors, which buckets, and which bytes of this host's devices fill each.

    layout = layout_for(specs, shapes, dtype, bucket_bytes, processes, process)

The weight publisher (`dart_jax.train.publish`) lays out every version it publishes; the
layout is a pure function of shapes, shardings and the bucket size, so every trainer host
computes the same one from the same program, with no communication. Each tensor is cut
into the blocks its parameter's sharding gives it, each distinct block is served by one
device holding it (replicated blocks rotate among their holders, tensor by tensor), and
the blocks are cut into rows that fit a bucket (`dart_jax.wire.weights`: the format both
ends share).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np

from dart_jax.models.convert import ParamSpec
from dart_jax.wire.messages import PieceInfo, TensorInfo, WeightBucketInfo
from dart_jax.wire.weights import ITEMSIZE, pack_buckets, split_block


@dataclasses.dataclass(frozen=True)
class LocalPiece:
    """Where a piece's bytes lie on this host: a byte range of one device's shard of one
    converted parameter (all its layers, for a stacked one)."""
    param: int  # position in the conversion order
    device: jax.Device
    offset: int
    nbytes: int


@dataclasses.dataclass(frozen=True)
class Layout:
    """A version's tensors and buckets (every host's) and this host's pieces per bucket.
    A pure function of shapes, shardings and the bucket size: every host computes the same."""
    tensors: list[TensorInfo]
    buckets: list[WeightBucketInfo]
    local: dict[int, list[LocalPiece]]  # bucket index -> its pieces, for the buckets this host serves


def layout_for(specs: list[ParamSpec], shapes: dict[tuple, jax.ShapeDtypeStruct], dtype: str, bucket_bytes: int,
               processes: int, process: int) -> Layout:
    """Tensors in checkpoint order (`specs`), each cut into the blocks its parameter's
    sharding gives it (`shapes`: the converted parameters); each distinct block served by
    one device holding it (replicated blocks rotate among their holders, tensor by tensor),
    cut into rows that fit a bucket."""
    order = {path: i for i, path in enumerate(shapes)}
    tensors = [TensorInfo(name=s.hf_name, dtype=dtype, shape=list(s.hf_shape)) for s in specs]
    host_pieces: list[list[PieceInfo]] = [[] for _ in range(processes)]
    where: dict[int, LocalPiece] = {}
    size = ITEMSIZE[dtype]
    for t, spec in enumerate(specs):
        x = shapes[spec.path]
        for device, start, shape in _owned_blocks(x, t):
            if spec.layer is not None:  # the block of one layer, inside the shard of all of them
                if not start[0] <= spec.layer < start[0] + shape[0]:
                    continue
                layer_offset = (spec.layer - start[0]) * math.prod(shape[1:])
                start, shape = start[1:], shape[1:]
            else:
                layer_offset = 0
            for s, sh in split_block(start, shape, size, bucket_bytes):
                piece = PieceInfo(tensor=t, start=list(s), shape=list(sh))
                host_pieces[device.process_index].append(piece)
                offset = layer_offset + (int(np.ravel_multi_index(np.subtract(s, start), shape)) if shape else 0)
                where[id(piece)] = LocalPiece(order[spec.path], device, offset * size, math.prod(sh) * size)
    buckets = pack_buckets(host_pieces, tensors, bucket_bytes)
    local = {b.index: [where[id(p)] for p in b.pieces] for b in buckets if b.host == process}
    return Layout(tensors, buckets, local)


def _owned_blocks(x: jax.ShapeDtypeStruct, rotation: int) -> list[tuple[jax.Device, tuple[int, ...], tuple[int, ...]]]:
    holders: dict[tuple, list[jax.Device]] = {}
    for device, index in x.sharding.devices_indices_map(x.shape).items():
        holders.setdefault(tuple(s.indices(n)[:2] for s, n in zip(index, x.shape)), []).append(device)
    return [(devices[rotation % len(devices)], tuple(a for a, _ in block), tuple(b - a for a, b in block))
            for block, devices in holders.items()]
