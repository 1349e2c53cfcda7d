import jax.numpy as jnp
import numpy as np
import pytest

from dart_jax.train.selection import select_steps, step_mean_entropy, top_entropy_steps

# Step mean entropies 0.5, 2.0, 1.0, 3.0; the 9.0s sit on padding and must not count.
ENT = jnp.array([[0.5, 0.5, 9.0], [1.0, 3.0, 9.0], [1.0, 9.0, 9.0], [3.0, 3.0, 3.0],
                 [9.0, 9.0, 9.0]])
MASK = jnp.array([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0],
                  [0.0, 0.0, 0.0]])
VALID = jnp.array([1, 1, 1, 1, 0])


def test_step_mean_entropy_masks_padding():
    np.testing.assert_allclose(step_mean_entropy(ENT, MASK), [0.5, 2.0, 1.0, 3.0, 0.0])


@pytest.mark.parametrize("fraction,keep", [
    (0.5, [0, 1, 0, 1, 0]),  # top 2 of 4
    (0.6, [0, 1, 1, 1, 0]),  # ceil(2.4) = 3
    (0.8, [1, 1, 1, 1, 0]),  # ceil(3.2) = 4; padding never kept
    (0.1, [0, 0, 0, 1, 0]),  # at least one
])
def test_keeps_top_fraction(fraction, keep):
    got, metrics = top_entropy_steps(step_mean_entropy(ENT, MASK), VALID, fraction)
    assert got.tolist() == keep
    np.testing.assert_allclose(metrics["select/kept_frac"], sum(keep) / 4)


def test_metrics():
    _, m = top_entropy_steps(step_mean_entropy(ENT, MASK), VALID, 0.5)
    np.testing.assert_allclose(m["select/threshold"], 2.0)
    np.testing.assert_allclose(m["select/entropy_kept"], 2.5)
    np.testing.assert_allclose(m["select/entropy_dropped"], 0.75)


# Two groups, trajectory-normalized (hand-computed): group 0 holds a success of 2 steps (A =
# (2/3) / sqrt(1/3) = 1.1547), failures of 3 steps and 1 step (A = -0.5774); group 1 a one-step
# success and a two-step failure (A = +-0.7071). 9 steps in 5 trajectories: each trajectory's
# steps share 9/5 = 1.8 of weight. The 10th row is padding.
GROUP = jnp.array([0, 0, 0, 0, 0, 0, 1, 1, 1, 0])
A = jnp.array([1.1547005, 1.1547005, -0.5773503, -0.5773503, -0.5773503, -0.5773503, 0.7071068, -0.7071068,
               -0.7071068, 0.0])
W = jnp.array([0.9, 0.9, 0.6, 0.6, 0.6, 1.8, 1.8, 0.9, 0.9, 0.0])
H = jnp.array([0.1, 0.2, 0.9, 0.8, 0.7, 0.3, 0.5, 0.6, 0.4, 9.0])
V = jnp.array([1, 1, 1, 1, 1, 1, 1, 1, 1, 0])
NONE = jnp.zeros(10)


def _signed_sums(w):
    return [float(jnp.sum(jnp.where(GROUP == g, w * A, 0.0) * V)) for g in (0, 1)]


def test_the_signed_weights_sum_to_zero_before_selection():
    np.testing.assert_allclose(_signed_sums(W), [0.0, 0.0], atol=1e-6)


def test_balanced_selection_keeps_each_groups_signed_weights_summing_to_zero():
    """fraction 0.5 per (group, sign): group 0's success keeps its step of entropy 0.2 at twice
    its weight; its failures keep the two steps of 0.9 and 0.8 at three times theirs (their
    cell's 3.6 of weight now on 1.2); group 1's success keeps its one step, its failure the
    step of 0.6 at twice its weight."""
    w, m = select_steps(H, A, W, GROUP, V, NONE, fraction=0.5, scope="balanced", num_groups=10)
    np.testing.assert_allclose(w, [0, 1.8, 1.8, 1.8, 0, 0, 1.8, 1.8, 0, 0], atol=1e-6)
    np.testing.assert_allclose(_signed_sums(w), [0.0, 0.0], atol=1e-5)
    np.testing.assert_allclose(m["select/kept_frac"], 5 / 9)


def test_batch_wide_selection_breaks_the_balance():
    """fraction 0.5 over the batch: the top 5 of 9 entropies (0.9, 0.8, 0.7, 0.6, 0.5) are three
    failures of group 0, one success and one failure of group 1: group 0 keeps only failures."""
    w, _ = select_steps(H, A, W, GROUP, V, NONE, fraction=0.5, scope="batch", num_groups=10)
    np.testing.assert_allclose(w, [0, 0, 0.6, 0.6, 0.6, 0, 1.8, 0.9, 0, 0], atol=1e-6)
    np.testing.assert_allclose(_signed_sums(w), [-1.8 * 0.5773503, 1.8 * 0.7071068 - 0.9 * 0.7071068], atol=1e-5)


@pytest.mark.parametrize("scope", ["batch", "balanced"])
def test_protected_steps_are_never_dropped(scope):
    """The pool's injected success (steps 0 and 1, the batch's lowest entropies) stays in."""
    protect = jnp.array([1, 1, 0, 0, 0, 0, 0, 0, 0, 0])
    w, _ = select_steps(H, A, W, GROUP, V, protect, fraction=0.5, scope=scope, num_groups=10)
    assert float(w[0]) > 0 and float(w[1]) > 0
    if scope == "balanced":  # the success cell keeps all of it: no rescale
        np.testing.assert_allclose(w[:2], [0.9, 0.9], atol=1e-6)
        np.testing.assert_allclose(_signed_sums(w), [0.0, 0.0], atol=1e-5)


def test_cells_rank_their_own_steps():
    """Per cell: ceil(fraction * n) of each, at least one, ties toward the earlier row."""
    ent = jnp.array([1.0, 1.0, 2.0, 5.0, 0.0, 3.0])
    cell = jnp.array([0, 0, 0, 1, 1, 2])
    keep, _ = top_entropy_steps(ent, jnp.ones(6), 0.5, cell, 3)
    assert keep.tolist() == [1, 0, 1, 1, 0, 1]  # cell 0: 2.0 and the first 1.0; cell 1: 5.0; cell 2: its one
