"""Sharded forward on a 2x4 (fsdp x tp) CPU mesh equals the single-device forward."""

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from dart_jax.models.config import Qwen25VLConfig
from dart_jax.models.qwen25vl import abstract_model
from dart_jax.models.sharding import logical_to_spec, make_mesh, param_shardings
from dart_jax.policy import load_hf
from tests.models import hf_reference as R


def test_logical_rules_drop_axes_that_do_not_divide():
    mesh_shape = {"data": 1, "fsdp": 2, "tp": 4}
    assert logical_to_spec(("vocab", "embed"), (256, 64), mesh_shape) == P("tp", "fsdp")
    assert logical_to_spec(("embed", "q_heads"), (64, 6), mesh_shape) == P("fsdp", None)
    assert logical_to_spec(("batch", "length", "act_embed"), (4, 9, 64), mesh_shape) == P("fsdp", None, None)
    with pytest.raises(KeyError, match="no rule"):
        logical_to_spec(("nonsense",), (4,), mesh_shape)


def test_param_shardings_follow_the_table():
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 devices")
    _, abstract = abstract_model(Qwen25VLConfig.from_hf(R.hf_config("a").to_dict()))
    shardings = param_shardings(abstract, make_mesh(1, 2, 4))
    layer = shardings["model"]["layers"]  # stacked: the leading layer axis is never split
    assert shardings["model"]["embed_tokens"]["embedding"].spec == P("tp", "fsdp")
    assert layer["self_attn"]["q_proj"]["kernel"].spec == P(None, "fsdp", "tp")
    assert layer["mlp"]["down_proj"]["kernel"].spec == P(None, "tp", "fsdp")
    assert layer["input_layernorm"]["weight"].spec == P(None, None)
    assert shardings["visual"]["blocks"]["attn"]["qkv"]["kernel"].spec == P(None, "fsdp", "tp")


@pytest.mark.parametrize("shape", [(1, 2, 4), (2, 2, 2)])  # (data, fsdp, tp)
def test_mesh_forward_matches_single_device(hf_models, shape):
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
    path, _ = hf_models["a"]
    single = load_hf(path)
    sharded = load_hf(path, mesh=make_mesh(*shape))
    emb = sharded.params["model"]["embed_tokens"]["embedding"].get_value()
    assert emb.sharding.spec == P("tp", "fsdp") and len(emb.addressable_shards) == 8
    assert emb.addressable_shards[0].data.shape == (256 // shape[2], 64 // shape[1])
    rng = np.random.default_rng(4)
    pv, grid = R.images([(56, 84), (112, 56), (84, 140), (56, 56)], seed=4)
    rows = [
        list(rng.integers(2, 200, 3)) + R.image_tokens(grid[0]) + R.image_tokens(grid[1]) + [9],
        list(rng.integers(2, 200, 5)) + R.image_tokens(grid[2]),
        [4] + R.image_tokens(grid[3]) + [5, 6],
        list(rng.integers(2, 200, 11)),
    ]
    ids, mask = R.batch(rows)
    a = single.logits(ids, mask, pv, grid)
    b = sharded.logits(ids, mask, pv, grid)
    assert np.abs(a - b)[mask > 0].max() <= 1e-5
