"""HF -> Flax -> HF round trip, naming schemes, shards, and errors that name the bad tensors."""

import json
import shutil

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from dart_jax.models.hf_io import checkpoint_index, load_model
from dart_jax.policy import load_hf
from tests.models import hf_reference as R


def tensors(path):
    out = {}
    for f in sorted(path.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def rewrite(src, dst, fn):
    """Copy a checkpoint dir, passing its tensors dict through fn."""
    shutil.copytree(src, dst)
    save_file(fn(load_file(dst / "model.safetensors")), dst / "model.safetensors", metadata={"format": "pt"})
    return dst


@pytest.mark.parametrize("name", ["a", "b"])  # untied and tied
def test_round_trip_is_bit_exact_and_loads_in_transformers(hf_models, name, tmp_path):
    import torch
    from transformers import Qwen2_5_VLForConditionalGeneration

    src, hf = hf_models[name]
    (src / "tokenizer_config.json").write_text("{}")
    (src / "chat_template.jinja").write_text("{{ messages }}")
    out = load_hf(src).export_hf(tmp_path / "out")
    a, b = tensors(src), tensors(out)
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes(), k
    assert (out / "tokenizer_config.json").read_text() == "{}" and (out / "chat_template.jinja").exists()

    back = Qwen2_5_VLForConditionalGeneration.from_pretrained(out, attn_implementation="eager").eval()
    assert back.config.tie_word_embeddings == hf.config.tie_word_embeddings
    pv, grid = R.images([(56, 84)])
    ids, mask = R.batch([[5, 6] + R.image_tokens(grid[0]) + [7, 8]])
    with torch.no_grad():
        assert np.array_equal(R.hf_logits(back, ids, mask, pv, grid), R.hf_logits(hf, ids, mask, pv, grid))


def test_bf16_checkpoint_round_trip_in_bf16(hf_models, tmp_path):
    src = rewrite(hf_models["a"][0], tmp_path / "bf16", lambda t: {k: v.astype(ml_dtypes.bfloat16) for k, v in t.items()})
    policy = load_hf(src)
    assert policy.source_dtype == "bfloat16"
    out = policy.export_hf(tmp_path / "out")
    a, b = tensors(src), tensors(out)
    assert all(b[k].dtype == a[k].dtype and a[k].tobytes() == b[k].tobytes() for k in a)


def test_multi_shard_export_and_transformers5_names(hf_models, tmp_path):
    from dart_jax.models import hf_io

    src, _ = hf_models["a"]
    model, _ = load_model(src)
    from flax import nnx

    out = hf_io.export(nnx.state(model), model.config, tmp_path / "sharded", shard_bytes=20_000)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 2
    assert set(index["weight_map"]) == set(tensors(src))
    reloaded, _ = load_model(out)
    renamed = rewrite(src, tmp_path / "t5", lambda t: {
        k.replace("model.", "model.language_model.", 1) if k.startswith("model.") else
        "model." + k if k.startswith("visual.") else k: v for k, v in t.items()})
    assert any(e.name.startswith("model.language_model.") for e in checkpoint_index(renamed).values())
    renamed_model, _ = load_model(renamed)
    for m in (reloaded, renamed_model):
        for (p, x), (_, y) in zip(nnx.to_flat_state(nnx.state(model)), nnx.to_flat_state(nnx.state(m))):
            assert np.array_equal(np.asarray(x.get_value()), np.asarray(y.get_value())), p


@pytest.mark.parametrize("edit, message", [
    (lambda t: {k: v for k, v in t.items() if k != "model.layers.1.mlp.up_proj.weight"},
     "missing tensors: model.layers.1.mlp.up_proj.weight"),
    (lambda t: t | {"visual.blocks.9.attn.qkv.weight": np.zeros((2, 2), np.float32)},
     "unexpected tensors: visual.blocks.9.attn.qkv.weight"),
    (lambda t: t | {"model.norm.weight": np.zeros((3,), np.float32)},
     "mis-shaped tensors: model.norm.weight (3,) (expected (64,))"),
])
def test_bad_checkpoint_names_the_tensors(hf_models, tmp_path, edit, message):
    bad = rewrite(hf_models["a"][0], tmp_path / "bad", edit)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_model(bad)
