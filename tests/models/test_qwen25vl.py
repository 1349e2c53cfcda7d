"""The trainer-facing functions: hidden states + LM head kernel under jit/grad, remat, bf16."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dart_jax.models.hf_io import load_model
from dart_jax.models.inputs import make_inputs
from dart_jax.models.qwen25vl import hidden_states, lm_head_kernel, logits
from tests.models import hf_reference as R


def jit_logits(model, inputs):
    graphdef, params = nnx.split(model)
    return jax.jit(lambda p, i: logits((graphdef, p), i))(params, inputs)


def batch(config):
    pv, grid = R.images([(56, 84), (84, 56)], seed=5)
    ids, mask = R.batch([[3, 4] + R.image_tokens(grid[0]) + [5, 6, 7], [8] + R.image_tokens(grid[1]) + [9]])
    return make_inputs(config, ids, mask, pv, grid), ids


def token_logprob_sum(graphdef, params, inputs, targets, chunk=4):
    """Sum of target log-probs, computed over T in chunks (never [T, V] at once)."""
    h = hidden_states((graphdef, params), inputs).astype(jnp.float32)
    w = lm_head_kernel((graphdef, params))
    total = 0.0
    for s in range(0, h.shape[1], chunk):
        lp = jax.nn.log_softmax(h[:, s : s + chunk] @ w, axis=-1)
        total += jnp.take_along_axis(lp, targets[:, s : s + chunk, None], axis=-1).sum()
    return total


@pytest.mark.parametrize("name", ["a", "b"])
def test_hidden_states_and_head_give_logits(hf_models, name):
    model, _ = load_model(hf_models[name][0])
    inputs, _ = batch(model.config)
    graphdef, params = nnx.split(model)
    h = jax.jit(lambda p, i: hidden_states((graphdef, p), i))(params, inputs)
    w = lm_head_kernel((graphdef, params))
    if model.config.tie_word_embeddings:
        assert np.array_equal(w, model.model.embed_tokens.embedding.get_value().T)
    np.testing.assert_allclose(np.asarray(h @ w), np.asarray(jit_logits(model, inputs)), atol=1e-5)


def test_gradients_with_remat_match_without(hf_models):
    path = hf_models["a"][0]
    grads = {}
    for remat in ("none", "full", "dots", "offload"):
        model, _ = load_model(path, remat=remat)
        inputs, ids = batch(model.config)
        graphdef, params = nnx.split(model)
        targets = jnp.asarray(np.roll(ids, -1, axis=1))
        grads[remat] = jax.jit(jax.grad(lambda p: token_logprob_sum(graphdef, p, inputs, targets)))(params)
    for remat in ("full", "dots", "offload"):
        for a, b in zip(jax.tree.leaves(grads["none"]), jax.tree.leaves(grads[remat])):
            a, b = np.asarray(a), np.asarray(b)  # recomputation reorders fp32 sums: compare to the leaf's scale
            assert np.abs(a - b).max() <= 1e-5 * np.abs(a).max() + 1e-7
    assert any(float(jnp.abs(g).max()) > 0 for g in jax.tree.leaves(grads["none"]["visual"]))


def test_bf16_compute_keeps_fp32_params_and_logits(hf_models):
    path = hf_models["a"][0]
    f32, _ = load_model(path)
    bf16, _ = load_model(path, dtype="bfloat16")
    inputs, _ = batch(f32.config)
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(nnx.state(bf16)))
    graphdef, params = nnx.split(bf16)
    assert hidden_states((graphdef, params), inputs).dtype == jnp.bfloat16
    out = jit_logits(bf16, inputs)
    assert out.dtype == jnp.float32
    ref = np.asarray(jit_logits(f32, inputs))
    assert np.abs(np.asarray(out) - ref).max() <= 0.03 * np.abs(ref).max()


def test_unknown_options_are_errors_at_load(hf_models):
    with pytest.raises(ValueError, match="unknown remat policy 'sometimes'"):
        load_model(hf_models["a"][0], remat="sometimes")
    with pytest.raises(ValueError, match="unknown attention implementation 'fast'"):
        load_model(hf_models["a"][0], attention="fast")


def test_long_inputs_blockwise_attention_matches_dense(hf_models):
    """Past one block (512) of keys the XLA path runs blockwise, in the decoder (T = 641) and in
    the vision tower's full attention (784 slots): the logits equal the dense path's."""
    path = hf_models["a"][0]
    pv, grid = R.images([(392, 392)], seed=6)
    rng = np.random.default_rng(6)
    ids, mask = R.batch([list(rng.integers(2, 200, 40)) + R.image_tokens(grid[0]) + list(rng.integers(2, 200, 400)),
                         list(rng.integers(2, 200, 300))], pad="right")
    out = {}
    for impl in ("dense", "xla"):
        model, _ = load_model(path, attention=impl)
        inputs = make_inputs(model.config, ids, mask, pv, grid)
        assert inputs.input_ids.shape[1] > 512 and inputs.pixel_values.shape[1] > 512
        out[impl] = np.asarray(jit_logits(model, inputs))
    err = np.abs(out["xla"] - out["dense"])[mask > 0].max()
    assert 0 < err <= 1e-5 * np.abs(out["dense"]).max(), err  # 0 would mean one path ran twice
