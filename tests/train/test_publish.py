"""The weight publisher on a sharded mesh (8 CPU devices): what a worker pulls is what the
export writes, in the engine's dtype; the conversion moves nothing between devices; the
version is announced before its buckets are filled; the served window reuses its
buffers; a worker on the trainer's machine takes the buckets through shared memory, checked
on its own copy, and over the wire when it cannot map them; and tensors of Qwen2.5-VL-7B's
embedding shape travel under the default message limit."""

import os

import numpy as np
import pytest
from flax import nnx

import jax
from dart_jax.models import convert, hf_io
from dart_jax.models.sharding import make_mesh
from dart_jax.train.publish import WeightPublisher
from dart_jax.wire import WireConfig
from dart_jax.wire.config import WeightSyncConfig
from dart_jax.wire.shm import available
from dart_jax.wire.weights import WeightTransferError
from rollout_gpu.pull import Puller

LOOPBACK = WireConfig(endpoint="tcp://127.0.0.1:0")
COLLECTIVES = ("all-gather", "all-reduce", "all-to-all", "collective-permute", "reduce-scatter")


@pytest.fixture(scope="module")
def sharded(tiny_dir):
    model, _ = hf_io.load_model(tiny_dir, mesh=make_mesh(fsdp=4, tp=2))
    return model.config, nnx.state(model)


def _publisher(config, **kw) -> WeightPublisher:
    return WeightPublisher(WeightSyncConfig(announce=LOOPBACK, serve=LOOPBACK, **kw), config)


def pull(publisher: WeightPublisher, version: int, **kw) -> dict:
    ann = publisher._versions[version].announce
    with Puller(ann, WireConfig(endpoint=ann.hosts[0], timeout_s=30), timeout_s=60, **kw) as pulled:
        return {info.name: (info, np.array(data)) for info, data in pulled}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_sharded_publish_is_pulled_exactly_as_the_export_writes_it(sharded, dtype):
    config, params = sharded
    publisher = _publisher(config, dtype=dtype, bucket_mb=1)
    try:
        version = publisher.publish(params)
        got = pull(publisher, version)
    finally:
        publisher.close()
    want = dict(convert.hf_tensors(params, config, dtype))
    assert sorted(got) == sorted(want)
    for name, x in want.items():
        info, data = got[name]
        assert info.dtype == dtype and info.shape == list(x.shape)
        assert data.tobytes() == np.ascontiguousarray(x).tobytes(), name
    assert publisher.bytes_served == publisher.stages["bytes"] == publisher.stages["host_bytes"]


def test_each_device_converts_its_own_shard_without_communication(sharded):
    config, params = sharded
    flat = dict(nnx.to_flat_state(params))
    sharded_kinds = set()
    for spec in convert.specs_for(params, config):
        if spec.layer not in (None, 0):
            continue
        x = flat[spec.path].get_value()
        fn = convert._converter(spec.kind, spec.hf_shape, "bfloat16", convert._hf_sharding(x, spec), False)
        hlo = fn.lower(x).compile().as_text()
        assert not [op for op in COLLECTIVES if op in hlo], (spec.hf_name, x.sharding)
        if len(x.sharding.device_set) > 1 and not x.sharding.is_fully_replicated:
            sharded_kinds.add(spec.kind)
    assert {"linear", "copy"} <= sharded_kinds  # the check saw sharded kernels and embeddings


def test_the_version_is_announced_before_its_buckets_fill_and_the_window_reuses_buffers(sharded):
    config, params = sharded
    publisher = _publisher(config, keep_versions=2)
    announced = []
    send = publisher.pub.send

    def record(ann):
        served = publisher._versions[ann.version]
        announced.append((ann.version, sum(b.ready.is_set() for b in served.buckets.values())))
        send(ann)
    publisher.pub.send = record
    try:
        first = publisher.publish(params)
        pointers = {n: x.addressable_shards[0].data.unsafe_buffer_pointer()
                    for n, x in publisher._versions[first].arrays.items()}
        publisher.publish(params)
        third = publisher.publish(jax.tree.map(lambda x: x * 2, params))
        reused = {n: x.addressable_shards[0].data.unsafe_buffer_pointer()
                  for n, x in publisher._versions[third].arrays.items()}
        got = pull(publisher, third)
    finally:
        publisher.close()
    first_sends = {v: filled for v, filled in reversed(announced)}  # the repeater re-sends too
    assert first_sends == {1: 0, 2: 0, 3: 0}  # each version announced with no bucket filled yet
    assert sorted(publisher._versions) == [2, 3]
    assert reused == pointers  # the third version converted into the first one's buffers
    want = dict(convert.hf_tensors(jax.tree.map(lambda x: x * 2, params), config, "float32"))
    assert all(got[n][1].tobytes() == np.ascontiguousarray(x).tobytes() for n, x in want.items())


def _exact(got: dict, params, config, dtype: str) -> bool:
    want = dict(convert.hf_tensors(params, config, dtype))
    return sorted(got) == sorted(want) and all(got[n][1].tobytes() == np.ascontiguousarray(x).tobytes()
                                               for n, x in want.items())


@pytest.mark.skipif(not available(), reason="no /dev/shm")
def test_a_worker_on_the_trainers_machine_takes_the_buckets_through_shared_memory(sharded):
    config, params = sharded
    doubled = jax.tree.map(lambda x: x * 2, params)
    publisher = _publisher(config, dtype="bfloat16", bucket_mb=1, keep_versions=2, share_memory=True)
    regions, buffers = {}, {}
    try:
        first = publisher.publish(params)
        assert _exact(pull(publisher, first, regions=regions, buffers=buffers), params, config, "bfloat16")
        mapped = dict(regions)
        second = publisher.publish(doubled)
        assert _exact(pull(publisher, second, regions=regions, buffers=buffers), doubled, config, "bfloat16")
        third = publisher.publish(params)  # takes the first version's slot and region
        assert _exact(pull(publisher, third, regions=regions, buffers=buffers), params, config, "bfloat16")
        slots = {v: (s.slot, s.region.token) for v, s in publisher._versions.items()}
        host_bytes = publisher.stages["host_bytes"]
    finally:
        publisher.close()
    assert len(mapped) == 1 and len(regions) == 2 and set(mapped) <= set(regions)  # mapped once, kept
    assert slots[third] == (0, next(iter(mapped)))
    assert publisher.bytes_served == 0 and publisher.bytes_shared == 3 * host_bytes  # no byte over the wire
    assert not publisher.regions.path.exists()  # closed: its directory is gone
    assert all(region.unlinked() for region in regions.values())
    Puller(publisher._versions[third].announce, LOOPBACK, timeout_s=1, regions=regions).stop()
    assert regions == {}  # a worker's next pull lets the closed trainer's regions go


@pytest.mark.skipif(not available(), reason="no /dev/shm")
def test_a_shared_bucket_is_checked_on_the_workers_copy_and_an_unmappable_region_falls_back_to_the_wire(sharded):
    config, params = sharded
    publisher = _publisher(config, share_memory=True)
    try:
        version = publisher.publish(params)
        region = publisher._versions[version].region
        region.data[12345] ^= 0x20  # a later version writing over it, or corruption
        with pytest.raises(WeightTransferError, match="checksum mismatch"):
            pull(publisher, version)
        region.data[12345] ^= 0x20
        os.unlink(region.path)  # as a worker in another /dev/shm (a container) sees it
        assert _exact(pull(publisher, version), params, config, "float32")
        assert publisher.bytes_served == publisher.stages["host_bytes"]
    finally:
        publisher.close()


@pytest.mark.skipif(not available(), reason="no /dev/shm")
def test_a_dev_shm_too_small_for_the_regions_leaves_every_worker_on_the_wire(sharded, monkeypatch):
    config, params = sharded
    publisher = _publisher(config, share_memory=True)

    def full(fd, offset, length):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "posix_fallocate", full)
    try:
        version = publisher.publish(params)  # a container's 64 MiB /dev/shm: reserved up front, refused
        assert publisher.regions is None and publisher._versions[version].region is None
        assert _exact(pull(publisher, version), params, config, "float32")
        assert publisher.bytes_served == publisher.stages["host_bytes"] and publisher.bytes_shared == 0
    finally:
        publisher.close()


@pytest.mark.slow
def test_tensors_of_the_7b_embedding_shape_travel_under_the_default_message_limit(tiny_dir):
    """Qwen2.5-VL-7B's embed_tokens and lm_head: 152064 x 3584 bf16, 1.09 GB each, four
    times the default 256 MiB message; the lm_head kernel is transposed on the device."""
    import ml_dtypes
    vocab, hidden = 152064, 3584
    rng = np.random.default_rng(7)
    bits = lambda shape: (rng.integers(0, 2**14, shape, dtype=np.uint16) | 0x3C00).view(ml_dtypes.bfloat16)  # noqa: E731
    embed, head = bits((vocab, hidden)), bits((hidden, vocab))
    state = nnx.State({"model": {"embed_tokens": {"embedding": nnx.Param(jax.numpy.asarray(embed))}},
                       "lm_head": {"kernel": nnx.Param(jax.numpy.asarray(head))}})
    cfg = WeightSyncConfig(announce=LOOPBACK, serve=LOOPBACK, dtype="bfloat16")
    assert cfg.serve.max_message_bytes == 256 * 2**20  # the default limit
    publisher = WeightPublisher(cfg, hf_io.read_config(tiny_dir))
    try:
        version = publisher.publish(state)
        ann = publisher._versions[version].announce
        assert max(b.nbytes for b in ann.buckets) <= cfg.bucket_mb * 2**20 < embed.nbytes
        with Puller(ann, WireConfig(endpoint=ann.hosts[0], timeout_s=60), timeout_s=600) as pulled:
            got = {info.name: (info, data) for info, data in pulled}
    finally:
        publisher.close()
    assert sorted(got) == ["lm_head.weight", "model.embed_tokens.weight"]
    for info, _ in got.values():
        assert info.shape == [vocab, hidden] and info.dtype == "bfloat16"
    assert np.array_equal(got["model.embed_tokens.weight"][1], embed.reshape(-1).view(np.uint8))
    lm_head = got["lm_head.weight"][1].view(np.uint16).reshape(vocab, hidden)
    for rows in range(0, vocab, 16384):  # torch layout: the kernel transposed, compared in slabs
        assert np.array_equal(lm_head[rows:rows + 16384], head.view(np.uint16)[:, rows:rows + 16384].T), rows
