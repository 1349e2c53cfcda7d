import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dart_jax.train.kernels import (auto_chunks, kernel_chunks, naive_token_logprobs_entropy, token_logprobs_entropy,
                                    token_logprobs_entropy_BxT)


def _inputs(T=37, D=16, V=101, seed=0):
    k = jax.random.split(jax.random.key(seed), 6)
    h = jax.random.normal(k[0], (T, D))
    w = jax.random.normal(k[1], (D, V)) * 0.5
    tok = jax.random.randint(k[2], (T,), 0, V)
    mask = (jax.random.uniform(k[3], (T,)) < 0.7).astype(jnp.float32)
    a = jax.random.normal(k[4], (T,)) * mask
    b = jax.random.normal(k[5], (T,)) * mask
    return h, w, tok, a, b


def _loss(fn, tok, a, b, **kw):
    def loss(h, w):
        logp, ent = fn(h, w, tok, **kw)
        return jnp.sum(a * logp) + jnp.sum(b * ent)
    return loss


# chunk sizes that divide, do not divide, and exceed T=37 and V=101
@pytest.mark.parametrize("ct,cv,temperature", [(8, 16, 1.0), (5, 33, 0.7), (37, 101, 0.7),
                                               (64, 1000, 1.0), (1, 7, 0.7)])
def test_matches_full_logits_values_and_gradients(ct, cv, temperature):
    h, w, tok, a, b = _inputs()
    fused = _loss(token_logprobs_entropy, tok, a, b, temperature_T=temperature, chunk_tokens=ct,
                  chunk_vocab=cv, entropy_grad=True)
    naive = _loss(naive_token_logprobs_entropy, tok, a, b, temperature_T=temperature)
    lp1, e1 = token_logprobs_entropy(h, w, tok, temperature_T=temperature, chunk_tokens=ct,
                                     chunk_vocab=cv)
    lp2, e2 = naive_token_logprobs_entropy(h, w, tok, temperature)
    np.testing.assert_allclose(lp1, lp2, atol=1e-5)
    np.testing.assert_allclose(e1, e2, atol=1e-5)
    (v1, g1), (v2, g2) = (jax.value_and_grad(f, argnums=(0, 1))(h, w) for f in (fused, naive))
    np.testing.assert_allclose(v1, v2, atol=1e-5, rtol=1e-6)
    for x, y in zip(g1, g2):
        np.testing.assert_allclose(x, y, atol=1e-5)
    assert float(jnp.abs(g1[1]).max()) > 0.1  # the gradients are not trivially zero


def test_entropy_carries_no_gradient_unless_asked():
    h, w, tok, a, b = _inputs()
    only_ent = lambda fn, **kw: jax.grad(_loss(fn, tok, 0 * a, b, **kw), argnums=(0, 1))(h, w)  # noqa: E731
    g_off = only_ent(token_logprobs_entropy, chunk_tokens=8, chunk_vocab=16)
    g_on = only_ent(token_logprobs_entropy, chunk_tokens=8, chunk_vocab=16, entropy_grad=True)
    g_ref = only_ent(naive_token_logprobs_entropy)
    assert all(float(jnp.abs(g).max()) == 0.0 for g in g_off)
    for x, y in zip(g_on, g_ref):
        np.testing.assert_allclose(x, y, atol=1e-5)


def test_batched_per_row_temperature_jitted():
    h, w, tok, _, _ = _inputs(T=24)
    tau_B = jnp.array([1.0, 0.5, 1.3])
    f = jax.jit(lambda h, w, t, tau: token_logprobs_entropy_BxT(h, w, t, tau, chunk_tokens=5,
                                                                chunk_vocab=30))
    lp, ent = f(h.reshape(3, 8, -1), w, tok.reshape(3, 8), tau_B[:, None])
    lp2, ent2 = naive_token_logprobs_entropy(h, w, tok, jnp.repeat(tau_B, 8))
    np.testing.assert_allclose(lp.reshape(-1), lp2, atol=1e-5)
    np.testing.assert_allclose(ent.reshape(-1), ent2, atol=1e-5)


def test_bf16_compute_close_to_fp32():
    h, w, tok, a, b = _inputs()
    lp, ent = token_logprobs_entropy(h.astype(jnp.bfloat16), w.astype(jnp.bfloat16), tok,
                                     chunk_tokens=8, chunk_vocab=16)
    lp2, ent2 = naive_token_logprobs_entropy(h, w, tok)
    assert lp.dtype == jnp.float32
    np.testing.assert_allclose(lp, lp2, atol=0.15)
    g = jax.grad(_loss(token_logprobs_entropy, tok, a, b, chunk_tokens=8, chunk_vocab=16),
                 argnums=(0, 1))(h.astype(jnp.bfloat16), w.astype(jnp.bfloat16))
    assert g[0].dtype == jnp.bfloat16 and g[1].dtype == jnp.bfloat16


def _temp_bytes(fn, T, D, V, **kw):
    def loss(h, w, tok, a):
        return jnp.sum(a * fn(h, w, tok, **kw)[0])
    args = (jax.ShapeDtypeStruct((T, D), jnp.float32), jax.ShapeDtypeStruct((D, V), jnp.float32),
            jax.ShapeDtypeStruct((T,), jnp.int32), jax.ShapeDtypeStruct((T,), jnp.float32))
    compiled = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(*args).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def test_temp_memory_does_not_grow_with_tokens_times_vocab():
    D, V = 32, 30_000
    kw = dict(chunk_tokens=256, chunk_vocab=2048)
    small, large = (_temp_bytes(token_logprobs_entropy, T, D, V, **kw) for T in (1024, 8192))
    naive = _temp_bytes(naive_token_logprobs_entropy, 1024, D, V)
    assert large <= 1.25 * small
    assert naive >= 10 * small  # the [T, V] logits alone are 1024 * 30000 * 4 bytes


@pytest.mark.parametrize("backend,tokens,vocab,want", [
    ("gpu", 8 * 4096, 151_936, (4096, 15_232)),  # 10 equal chunks of the Qwen2.5-VL vocab
    ("tpu", 8 * 4096, 151_936, (4096, 15_232)),
    ("cpu", 8 * 4096, 151_936, (1024, 8064)),
    ("cpu", 37, 101, (37, 101)),  # never larger than the problem
])
def test_auto_chunks_per_backend_and_shape(backend, tokens, vocab, want):
    assert auto_chunks(backend, tokens, vocab) == want


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_auto_chunks_are_exact(backend):
    """The chosen chunks (3 or 5 vocab chunks here, the last one shorter) change no value."""
    h, w, tok, a, b = _inputs(T=48, D=8, V=40_000, seed=3)
    ct, cv = auto_chunks(backend, 48, 40_000)
    fused = _loss(token_logprobs_entropy, tok, a, b, chunk_tokens=ct, chunk_vocab=cv, entropy_grad=True)
    naive = _loss(naive_token_logprobs_entropy, tok, a, b)
    (v1, g1), (v2, g2) = (jax.value_and_grad(f, argnums=(0, 1))(h, w) for f in (fused, naive))
    np.testing.assert_allclose(v1, v2, atol=1e-5, rtol=1e-6)
    for x, y in zip(g1, g2):
        np.testing.assert_allclose(x, y, atol=1e-5)


def test_kernel_config_sets_what_it_names_and_leaves_the_rest_auto():
    from dart_jax.train.config import KernelConfig
    assert kernel_chunks(KernelConfig(), "gpu", 8 * 4096, 151_936) == (4096, 15_232)
    assert kernel_chunks(KernelConfig(chunk_vocab=4096), "gpu", 8 * 4096, 151_936) == (4096, 4096)
    assert kernel_chunks(KernelConfig(chunk_tokens=256), "cpu", 100, 101) == (256, 101)
