import jax
import jax.numpy as jnp
import numpy as np

import pytest

from dart_jax.train.tis import mismatch_metrics, mismatch_sums, step_weight_sums, tis_weights

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


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_host_step_sums_are_the_compiled_weights_summed_per_step(level):
    """The per-task trace's numpy weights (tis.step_weight_sums) against tis_weights on
    deltas of both signs, some past the cap of 1.5 and one past exp's guard."""
    rng = np.random.default_rng(0)
    old = rng.normal(-2.0, 1.0, (5, 7)).astype(np.float32)
    rollout = (old - rng.normal(0.0, 0.8, (5, 7))).astype(np.float32)
    rollout[0, 0] = old[0, 0] - 40.0
    mask = (rng.random((5, 7)) < 0.7).astype(np.float32)
    mask[4] = 0.0  # a step without sampled tokens
    w, n = step_weight_sums(old, rollout, mask, cap=1.5, level=level)
    want = np.asarray(tis_weights(jnp.asarray(old), jnp.asarray(rollout), jnp.asarray(mask), cap=1.5, level=level))
    assert (want == 1.5).any() and (want[mask > 0] < 1.0).any()
    np.testing.assert_allclose(w, want.sum(axis=-1), rtol=1e-5)
    np.testing.assert_array_equal(n, mask.sum(axis=-1))
    assert w[4] == 0.0 and n[4] == 0.0


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
