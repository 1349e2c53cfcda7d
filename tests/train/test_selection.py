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
    failures of group 0, one success and one failure of group 1: group 0 keeps only failures.
    The batch is one cell, so the kept weights are scaled by sum w|A| before / after: 4 x 1.0392305
    (group 0's two sides) + 4 x 0.6363961 (group 1's) over 3 x 0.3464102 + 1.2727922 + 0.6363961."""
    w, _ = select_steps(H, A, W, GROUP, V, NONE, fraction=0.5, scope="batch", num_groups=10)
    k = (4 * 1.0392305 + 4 * 0.6363961) / (3 * 0.3464102 + 1.2727922 + 0.6363961)
    np.testing.assert_allclose(w, k * np.array([0, 0, 0.6, 0.6, 0.6, 0, 1.8, 0.9, 0, 0]), atol=1e-5)
    np.testing.assert_allclose(_signed_sums(w), [-k * 1.8 * 0.5773503, k * (1.8 - 0.9) * 0.7071068], atol=1e-5)


@pytest.mark.parametrize("scope", ["batch", "balanced"])
def test_selection_keeps_each_cells_weight_once(scope):
    """The one compensation: sum w|A| over the batch is what it was before selection, whatever
    the fraction (the train step then divides by every step's count, not the kept ones)."""
    before = float(jnp.sum(W * jnp.abs(A) * V))
    for fraction in (0.3, 0.5, 0.8):
        w, _ = select_steps(H, A, W, GROUP, V, NONE, fraction=fraction, scope=scope, num_groups=10)
        np.testing.assert_allclose(float(jnp.sum(w * jnp.abs(A) * V)), before, rtol=1e-5)


@pytest.mark.parametrize("scope", ["batch", "balanced"])
def test_the_lowest_entropy_step_of_each_cell_is_dropped(scope):
    """Entropies are the reverse of H: now the steps that were kept are the ones to drop. With
    fraction 0.5, the kept set must be exactly the top half by entropy (in each cell for
    balanced), so a selection that kept the lowest would fail here."""
    h = 1.0 - H
    w, _ = select_steps(h, A, W, GROUP, V, NONE, fraction=0.5, scope=scope, num_groups=10)
    kept = [i for i in range(9) if float(w[i]) > 0]
    if scope == "balanced":  # cells: g0+ {0: .9, 1: .8}, g0- {2: .1, 3: .2, 4: .3, 5: .7}, g1+ {6}, g1- {7: .4, 8: .6}
        assert kept == [0, 4, 5, 6, 8]
    else:  # the top 5 of 0.9 0.8 0.1 0.2 0.3 0.7 0.5 0.4 0.6
        assert kept == [0, 1, 5, 6, 8]


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
