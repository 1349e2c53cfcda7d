import jax
import jax.numpy as jnp
import numpy as np

from dart_jax.train.tis import mismatch_metrics, mismatch_sums, tis_weights

OLD = jnp.array([[-1.0, -2.0, -3.0]])
ROLLOUT = jnp.array([[-1.1, -1.8, -3.5]])  # deltas 0.1, -0.2, 0.5 (last token masked)
MASK = jnp.array([[1.0, 1.0, 0.0]])


def test_token_weights_are_capped_ratios():
    np.testing.assert_allclose(tis_weights(OLD, ROLLOUT, MASK, cap=1.0),
                               [[1.0, np.exp(-0.2), 0.0]], rtol=1e-5)
    np.testing.assert_allclose(tis_weights(OLD, ROLLOUT, MASK, cap=2.0),
                               [[np.exp(0.1), np.exp(-0.2), 0.0]], rtol=1e-5)


def test_sequence_weights_use_the_product_of_ratios():
    w = tis_weights(OLD, ROLLOUT, MASK, cap=1.0, level="sequence")
    np.testing.assert_allclose(w, [[np.exp(-0.1), np.exp(-0.1), 0.0]], rtol=1e-5)


def test_weights_carry_no_gradient():
    g = jax.grad(lambda old: tis_weights(old, ROLLOUT, MASK, cap=2.0).sum())(OLD)
    assert float(jnp.abs(g).max()) == 0.0


def test_mismatch_metrics():
    w = tis_weights(OLD, ROLLOUT, MASK, cap=1.0)
    m = mismatch_metrics(mismatch_sums(OLD, ROLLOUT, MASK, w, cap=1.0))
    np.testing.assert_allclose(m["tis/abs_delta_logp"], 0.15, rtol=1e-5)
    np.testing.assert_allclose(m["tis/truncated_frac"], 0.5)
    x = jnp.array([[-1.0, -2.0, -4.0, -0.5]])
    ones = jnp.ones_like(x)
    for y, corr in ((2 * x + 1, 1.0), (-x, -1.0)):
        s = mismatch_sums(x, y, ones, ones, cap=1.0)
        np.testing.assert_allclose(mismatch_metrics(s)["tis/corr"], corr, atol=1e-5)


def test_sums_split_over_micro_batches_exactly():
    k = jax.random.split(jax.random.key(0), 3)
    x, y = jax.random.normal(k[0], (4, 5)), jax.random.normal(k[1], (4, 5))
    m = (jax.random.uniform(k[2], (4, 5)) < 0.6).astype(jnp.float32)
    w = tis_weights(x, y, m, cap=1.0)
    whole = mismatch_sums(x, y, m, w, 1.0)
    halves = [mismatch_sums(x[s], y[s], m[s], w[s], 1.0) for s in (slice(0, 2), slice(2, 4))]
    summed = jax.tree.map(lambda a, b: a + b, *halves)
    for key, val in mismatch_metrics(whole).items():
        np.testing.assert_allclose(mismatch_metrics(summed)[key], val, rtol=1e-5)
