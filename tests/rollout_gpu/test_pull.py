"""The worker-side pull without JAX: reassembly, and the puller against a scripted server
(several hosts, corrupt replies, a stalled server, a stop from another thread)."""

import threading
import time

import numpy as np
import pytest

from dart_jax.wire import RemoteError, Server, WireConfig
from dart_jax.wire.messages import Error, PieceInfo, TensorInfo, WeightBucket, WeightPull
from dart_jax.wire.weights import ITEMSIZE, WeightTransferError, checksum, piece_bytes, split_block
from rollout_gpu.pull import Assembler, Puller
from tests.wire.test_weights import _announce


class Hosts:
    """Trainer hosts on loopback, each serving its buckets of one version from numpy arrays;
    `hooks[host](msg, reply)` may delay or rewrite a reply."""

    def __init__(self, tensors: dict[str, np.ndarray], host_blocks: dict[str, dict[int, list]], limit: int):
        names = list(tensors)
        self.infos = [TensorInfo(name=n, dtype=str(x.dtype), shape=list(x.shape)) for n, x in tensors.items()]
        n_hosts = 1 + max(h for blocks in host_blocks.values() for h in blocks)
        host_pieces = [[] for _ in range(n_hosts)]
        for i, name in enumerate(names):
            for h, blocks in host_blocks[name].items():
                size = tensors[name].itemsize
                host_pieces[h] += [PieceInfo(tensor=i, start=list(s), shape=list(sh)) for st, shp in blocks
                                   for s, sh in split_block(st, shp, size, limit)]
        self.arrays = [tensors[n] for n in names]
        self.hooks: dict[int, object] = {}
        self.served = [0] * n_hosts
        self.servers = [Server(WireConfig(endpoint="tcp://127.0.0.1:0"), self._handler(h), role=f"host{h}",
                               workers=4).start() for h in range(n_hosts)]
        self.ann = _announce(self.infos, host_pieces, [s.endpoint for s in self.servers], limit)

    def _handler(self, host):
        def handle(msg):
            if not isinstance(msg, WeightPull) or msg.bucket >= len(self.ann.buckets):
                return Error(code="bad_request", message="no")
            info = self.ann.buckets[msg.bucket]
            assert info.host == host
            frames = [np.ascontiguousarray(self.arrays[p.tensor][tuple(slice(s, s + n) for s, n in zip(p.start, p.shape))])
                      .reshape(-1).view(np.uint8) for p in info.pieces]
            reply = WeightBucket(version=msg.version, bucket=msg.bucket, checksum=checksum(frames), pieces=frames)
            self.served[host] += sum(f.nbytes for f in frames)
            hook = self.hooks.get(host)
            return hook(msg, reply) if hook else reply
        return handle

    def close(self):
        for s in self.servers:
            s.stop()


def _pull(ann, **kw) -> dict[str, np.ndarray]:
    kw.setdefault("timeout_s", 30)
    with Puller(ann, WireConfig(endpoint=ann.hosts[0], timeout_s=5), **kw) as pull:
        return {info.name: np.frombuffer(data, np.float32).reshape(info.shape).copy() for info, data in pull}


@pytest.fixture
def sharded():
    """Two tensors held by two hosts: one cut by columns (each half larger than a bucket),
    one replicated whole on host 1; buckets of 16 KiB."""
    rng = np.random.default_rng(0)
    tensors = {"lm_head.weight": rng.standard_normal((256, 80)).astype(np.float32),
               "model.norm.weight": rng.standard_normal(80).astype(np.float32)}
    blocks = {"lm_head.weight": {0: [((0, 0), (256, 40))], 1: [((0, 40), (256, 40))]},
              "model.norm.weight": {1: [((0,), (80,))]}}
    hosts = Hosts(tensors, blocks, limit=16 * 2**10)
    yield tensors, hosts
    hosts.close()


def test_a_tensor_cut_across_hosts_and_buckets_is_reassembled_intact(sharded):
    tensors, hosts = sharded
    assert len(hosts.ann.buckets) >= 4 and max(b.nbytes for b in hosts.ann.buckets) <= 16 * 2**10
    got = _pull(hosts.ann, depth=2)
    assert got.keys() == tensors.keys()
    for name, x in tensors.items():
        np.testing.assert_array_equal(got[name], x)
    per_host = [sum(b.nbytes for b in hosts.ann.buckets if b.host == h) for h in (0, 1)]
    assert hosts.served == per_host and 0 < per_host[0] < hosts.ann.total_bytes  # each host sent its share only


def test_cut_tensors_reuse_their_buffers_across_versions(sharded):
    tensors, hosts = sharded
    buffers: dict[str, np.ndarray] = {}
    _pull(hosts.ann, buffers=buffers)
    first = buffers["lm_head.weight"]
    assert "model.norm.weight" not in buffers  # one whole piece: a view of the received frame
    _pull(hosts.ann, buffers=buffers)
    assert buffers["lm_head.weight"] is first


def test_a_corrupt_piece_fails_the_pull(sharded):
    tensors, hosts = sharded

    def flip(msg, reply):
        data = reply.pieces[0].copy()
        data[3] ^= 0x10
        return WeightBucket(version=reply.version, bucket=reply.bucket, checksum=reply.checksum,
                            pieces=[data, *reply.pieces[1:]])
    hosts.hooks[1] = flip
    with pytest.raises(WeightTransferError, match="checksum mismatch"):
        _pull(hosts.ann)


def test_a_stalled_host_fails_the_pull_within_its_timeout_and_a_stop_ends_every_thread(sharded):
    tensors, hosts = sharded
    stall = threading.Event()
    hosts.hooks[0] = lambda msg, reply: stall.wait(20) and reply
    try:
        start = time.monotonic()
        with pytest.raises(WeightTransferError, match=r"not pulled within the pull timeout \(1.5 s\)"):
            _pull(hosts.ann, timeout_s=1.5)  # serve.timeout_s is 5 s: the pull's own bound comes first
        assert time.monotonic() - start < 4
        pull = Puller(hosts.ann, WireConfig(endpoint=hosts.ann.hosts[0], timeout_s=5), timeout_s=30)
        got = []
        consumer = threading.Thread(target=lambda: got.extend(_drain(pull)))
        consumer.start()
        time.sleep(0.5)
        stopped = time.monotonic()
        pull.stop()
        consumer.join(5)
        lanes = [t for t in threading.enumerate() if t.name.startswith(f"pull-v{hosts.ann.version}-")]
        assert not consumer.is_alive() and not lanes and time.monotonic() - stopped < 2
        assert got == ["Cancelled"]
    finally:
        stall.set()


def _drain(pull):
    try:
        list(pull)
        return ["done"]
    except Exception as e:
        return [type(e).__name__]


def test_an_announcement_naming_a_remote_host_is_refused_unless_remote_links_are_allowed(sharded):
    _, hosts = sharded
    remote = hosts.ann.__class__(**{f: getattr(hosts.ann, f) for f in hosts.ann.__struct_fields__} |
                                 {"hosts": ["tcp://10.1.2.3:5561", hosts.ann.hosts[1]]})
    with pytest.raises(ValueError, match="not loopback"):
        Puller(remote, WireConfig(endpoint=hosts.ann.hosts[0]), timeout_s=1)


def test_the_assembler_places_blocks_of_any_rank(seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((6, 5, 4)).astype(np.float32)
    t = [TensorInfo(name="visual.patch_embed.proj.weight", dtype="float32", shape=[6, 5, 4])]
    pieces = [PieceInfo(tensor=0, start=list(s), shape=list(sh)) for b in [((0, 0, 0), (6, 5, 2)), ((0, 0, 2), (6, 5, 2))]
              for s, sh in split_block(*b, 4, 24)]
    ann = _announce(t, [pieces], ["tcp://127.0.0.1:1"], limit=48)
    asm, done = Assembler(ann), []
    for b in ann.buckets:
        frames = [np.ascontiguousarray(x[tuple(slice(s, s + n) for s, n in zip(p.start, p.shape))]).reshape(-1).view(np.uint8)
                  for p in b.pieces]
        assert sum(f.nbytes for f in frames) == b.nbytes == sum(piece_bytes(p, t) for p in b.pieces)
        done += asm.add(b, frames)
    (info, data), = done
    np.testing.assert_array_equal(np.frombuffer(data, np.float32).reshape(6, 5, 4), x)
    assert ITEMSIZE[info.dtype] == 4 and not asm.missing()


def test_a_bucket_server_error_reaches_the_puller(sharded):
    _, hosts = sharded
    hosts.hooks[0] = lambda msg, reply: Error(code="not_found", message="version 1 is not served (newest: 2)")
    with pytest.raises(RemoteError, match="not served"):
        _pull(hosts.ann)
