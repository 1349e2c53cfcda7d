import jax.numpy as jnp
import numpy as np
import pytest

from dart_jax.train.selection import step_mean_entropy, top_entropy_steps

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
