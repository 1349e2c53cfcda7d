"""The one Flax <-> HF tensor conversion: names, layouts, buckets."""

import numpy as np
import pytest
from flax import nnx

from dart_jax.models.config import Qwen25VLConfig
from dart_jax.models.convert import hf_buckets, hf_tensors, specs_for
from dart_jax.models.qwen25vl import abstract_model, create_model
from dart_jax.wire.weights import canonical_hf_name
from tests.models import hf_reference as R


@pytest.fixture(scope="module")
def model():
    return create_model(Qwen25VLConfig.from_hf(R.hf_config("a").to_dict()), seed=1)


def test_names_and_layouts(model):
    specs = {s.hf_name: s for s in specs_for(nnx.state(model), model.config)}
    assert specs["visual.merger.mlp.0.weight"].path == ("visual", "merger", "mlp_0", "kernel")
    assert specs["model.embed_tokens.weight"].kind == "copy"
    assert specs["visual.patch_embed.proj.weight"].hf_shape == (32, 3, 2, 14, 14)
    q = specs["model.layers.1.self_attn.q_proj.weight"]
    assert q.kind == "linear" and q.hf_shape == q.shape[::-1]
    flat = dict(nnx.to_flat_state(nnx.state(model)))
    for name, x in hf_tensors(nnx.state(model), model.config):  # the device conversion, inverted by from_hf
        s = specs[name]
        param = np.asarray(flat[s.path].get_value())
        assert x.shape == s.hf_shape and np.array_equal(s.from_hf(x), param if s.layer is None else param[s.layer])
    assert canonical_hf_name("model.language_model.layers.0.mlp.up_proj.weight") == "model.layers.0.mlp.up_proj.weight"
    assert canonical_hf_name("model.visual.blocks.0.norm1.weight") == "visual.blocks.0.norm1.weight"
    _, abstract = abstract_model(model.config)
    assert [s.hf_name for s in specs_for(abstract, model.config)] == list(specs)


def test_buckets_cover_every_tensor_once_within_size(model):
    state = nnx.state(model)
    full = dict(hf_tensors(state, model.config))
    buckets = list(hf_buckets(state, model.config, bucket_bytes=40_000))
    assert len(buckets) > 3
    for b in buckets:
        assert len(b) == 1 or sum(x.nbytes for _, x in b) <= 40_000
    flat = [item for b in buckets for item in b]
    assert [n for n, _ in flat] == list(full)
    assert all(np.array_equal(x, full[n]) and x.flags.c_contiguous for n, x in flat)
    q_LxDxQ = np.asarray(model.model.layers.self_attn.q_proj.kernel.get_value())
    for i in range(len(q_LxDxQ)):  # stacked layers come out as one torch-layout tensor each
        assert np.array_equal(full[f"model.layers.{i}.self_attn.q_proj.weight"], q_LxDxQ[i].T)
    names = [n for n, _ in flat]
    layer_of = [int(n.split(".")[2]) for n in names if n.startswith("model.layers.")]
    assert layer_of == sorted(layer_of)  # layer by layer, as checkpoints list them
