"""Weight versions on the wire without JAX: cutting blocks into rows, buckets, the exact-cover
and completeness checks."""

import math

import numpy as np
import pytest

from dart_jax.wire.messages import PieceInfo, TensorInfo, WeightAnnounce
from dart_jax.wire.weights import WeightTransferError, check_announce, check_tensors, pack_buckets, split_block

LIMIT = 4 * 2**20


def test_blocks_are_cut_into_contiguous_row_ranges_within_the_limit(seed):
    rng = np.random.default_rng(seed)
    for shape in [(7, 5, 3), (3, 1000), (1, 1, 9), (4,), ()]:
        block = rng.standard_normal(shape).astype(np.float32)
        limit = int(rng.integers(4, 200))
        pieces = split_block((0,) * len(shape), shape, 4, limit)
        assert all(math.prod(sh) * 4 <= max(limit, 4) for _, sh in pieces)
        # in order, each piece is the next run of the block's bytes
        flat = np.concatenate([block[tuple(slice(s, s + n) for s, n in zip(st, sh))].reshape(-1)
                               for st, sh in pieces]) if shape else block.reshape(-1)
        np.testing.assert_array_equal(flat, block.reshape(-1))


def _tensor_pieces(shape, host_blocks, itemsize=4, limit=LIMIT):
    """pieces per host of one tensor cut into `host_blocks` (host -> list of (start, shape))."""
    return {h: [PieceInfo(tensor=0, start=list(s), shape=list(sh)) for b in blocks
                for s, sh in split_block(b[0], b[1], itemsize, limit)] for h, blocks in host_blocks.items()}


def _announce(tensors, host_pieces, hosts, limit=LIMIT, version=1):
    buckets = pack_buckets(host_pieces, tensors, limit)
    return WeightAnnounce(version=version, hosts=hosts, tensors=tensors, buckets=buckets,
                          total_bytes=sum(b.nbytes for b in buckets), published_at=0.0)


def test_buckets_never_exceed_the_limit_and_the_checks_refuse_bad_tilings():
    t = [TensorInfo(name="lm_head.weight", dtype="float32", shape=[64, 48])]
    ok = _tensor_pieces((64, 48), {0: [((0, 0), (64, 24))], 1: [((0, 24), (64, 24))]}, limit=1000)
    ann = _announce(t, [ok[0], ok[1]], ["tcp://127.0.0.1:1", "tcp://127.0.0.1:2"], limit=1000)
    assert all(b.nbytes <= 1000 for b in ann.buckets) and {b.host for b in ann.buckets} == {0, 1}
    largest = max(b.nbytes for b in ann.buckets)
    check_announce(ann, largest + 2**20)
    with pytest.raises(WeightTransferError, match="do not fit a message"):
        check_announce(ann, largest - 1 + 2**20)
    gap = _announce(t, [ok[0], ok[1][:-1]], ann.hosts, limit=1000)
    with pytest.raises(WeightTransferError, match="cover"):
        check_announce(gap, 2**30)
    over = _announce(t, [ok[0], ok[1][1:] + ok[0][:1]], ann.hosts, limit=1000)  # the same volume, one block twice
    with pytest.raises(WeightTransferError, match="overlap"):
        check_announce(over, 2**30)
    outside = [PieceInfo(tensor=0, start=[60, 0], shape=[8, 48])]
    with pytest.raises(WeightTransferError, match="does not lie in"):
        check_announce(_announce(t, [outside], ann.hosts[:1]), 2**30)
    with pytest.raises(WeightTransferError, match="host 1 of 1"):
        check_announce(_announce(t, [ok[0], ok[1]], ann.hosts[:1], limit=1000), 2**30)


def test_a_version_must_hold_exactly_the_models_tensors_in_the_engine_dtype():
    t = [TensorInfo(name="a.weight", dtype="bfloat16", shape=[4, 4]), TensorInfo(name="b.bias", dtype="bfloat16", shape=[4])]
    ann = WeightAnnounce(version=3, hosts=["tcp://127.0.0.1:1"], tensors=t, buckets=[], total_bytes=0, published_at=0.0)
    check_tensors(ann, {"a.weight": [4, 4], "b.bias": [4]}, "bfloat16")
    with pytest.raises(WeightTransferError, match="missing c.weight, unexpected none"):
        check_tensors(ann, {"a.weight": [4, 4], "b.bias": [4], "c.weight": [2]}, "bfloat16")
    with pytest.raises(WeightTransferError, match="missing none, unexpected b.bias"):
        check_tensors(ann, {"a.weight": [4, 4]}, "bfloat16")
    with pytest.raises(WeightTransferError, match="the engine loads float32"):
        check_tensors(ann, {"a.weight": [4, 4], "b.bias": [4]}, "float32")
