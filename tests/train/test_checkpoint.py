"""orbax checkpoints: a sharded train state and its JSON metadata on an 8-device mesh, restored
onto other shardings; keep-last-N; the data pipeline resumes at the same next batch."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from dart_jax.models.sharding import make_mesh
from dart_jax.train.checkpoint import CheckpointMeta, Checkpointer, abstract_state, config_hash
from dart_jax.train.sources import TrajectoryFileSource
from tests.train_batches import assert_trees_equal, collator


@dataclasses.dataclass(frozen=True)
class _Cfg:
    lr: float = 1e-6
    buckets: tuple[int, ...] = (768, 1024)


def _state(mesh):
    put = lambda x, spec: jax.device_put(x, NamedSharding(mesh, spec))  # noqa: E731
    params = {"w": put(jnp.arange(16 * 8, dtype=jnp.float32).reshape(16, 8), P("fsdp", "tp")),
              "b": put(jnp.linspace(-1, 1, 8, dtype=jnp.bfloat16), P())}
    opt = optax.adamw(1e-3)
    grads = jax.tree.map(lambda x: jnp.ones_like(x) * 0.5, params)
    opt_state = opt.update(grads, opt.init(params), params)[1]
    return {"params": params, "opt": opt_state, "step": jnp.int32(7), "rng": jax.random.key(3)}


def _shardings(state, mesh, spec_of):
    return jax.tree.map(lambda x: NamedSharding(mesh, spec_of(x)), state)


def test_save_restore_sharded_state_meta_and_pipeline_position(tmp_path, files, tiny_dir):
    mesh = make_mesh(data=1, fsdp=4, tp=2)
    state = _state(mesh)
    source = TrajectoryFileSource(files[0], collator(tiny_dir, 2), seed=5, shard=(0, 1), read_threads=1)
    it = iter(source)
    next(it), next(it)
    meta = CheckpointMeta(policy_version=4, data_state=it.get_state(), config_hash=config_hash(_Cfg()),
                          extra={"after_batch_id": 12})
    with Checkpointer(tmp_path / "ckpt") as ckpt:
        assert ckpt.latest_step() is None
        assert ckpt.save(100, state, meta)
    expected_next = next(it)

    # another mesh shape: params fully sharded over 8 devices on their first dimension
    other = make_mesh(data=1, fsdp=8, tp=1)
    spec_of = lambda x: P("fsdp") if np.ndim(x) == 2 else P()  # noqa: E731
    target = abstract_state(jax.eval_shape(lambda: state), _shardings(state, other, spec_of))
    with Checkpointer(tmp_path / "ckpt") as ckpt:
        assert ckpt.latest_step() == 100
        restored, got = ckpt.restore(target, config_hash=config_hash(_Cfg()))
        with pytest.raises(ValueError, match="saved under config"):
            ckpt.restore(target, 100, config_hash=config_hash(_Cfg(lr=2e-6)))
    assert got == meta
    assert jax.tree.structure(restored) == jax.tree.structure(state)
    for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(state)):
        assert a.dtype == b.dtype and a.sharding.mesh.shape == other.shape
    assert restored["params"]["w"].sharding.spec == P("fsdp")
    assert {s.data.shape for s in restored["params"]["w"].addressable_shards} == {(2, 8)}
    assert_trees_equal(jax.random.key_data(restored["rng"]), jax.random.key_data(state["rng"]))
    plain = lambda s: {k: v for k, v in s.items() if k != "rng"}  # noqa: E731
    assert_trees_equal(jax.device_get(plain(restored)), jax.device_get(plain(state)))
    assert jax.random.key_impl(restored["rng"]) == jax.random.key_impl(state["rng"])

    resumed = iter(TrajectoryFileSource(files[0], collator(tiny_dir, 2), seed=5, shard=(0, 1), read_threads=1))
    resumed.set_state(got.data_state)
    assert_trees_equal(next(resumed), expected_next)


def test_keeps_the_last_n_steps_and_saves_asynchronously(tmp_path):
    mesh = make_mesh(data=2, fsdp=2, tp=2)
    state = _state(mesh)
    meta = CheckpointMeta(policy_version=0, data_state={"after_batch_id": 0}, config_hash="x")
    with Checkpointer(tmp_path / "ckpt", max_to_keep=2) as ckpt:
        for step in range(1, 5):
            state = {**state, "step": jnp.int32(step)}
            assert ckpt.save(step, state, dataclasses.replace(meta, policy_version=step,
                                                              data_state={"after_batch_id": step}))
        ckpt.wait()
        assert ckpt.all_steps() == [3, 4] and ckpt.latest_step() == 4
        target = abstract_state(state, jax.tree.map(lambda x: x.sharding, state))
        restored, got = ckpt.restore(target, 3)
    assert int(restored["step"]) == 3 and got.data_state == {"after_batch_id": 3} and got.policy_version == 3
    with pytest.raises(FileNotFoundError):
        Checkpointer(tmp_path / "empty").restore(target)
