import jax.numpy as jnp
import numpy as np

from dart_jax.train.advantages import grpo_step_advantages, trajectory_step_weights

# Group 0: trajectory 0 (reward 1, two steps) and trajectory 1 (reward 0, one step).
# Group 1: trajectories 2 and 3, both reward 1 (no spread). Group 2: one trajectory alone.
# The last row is padding.
REWARD = jnp.array([1.0, 1.0, 0.0, 1.0, 1.0, 0.5, 7.0])
GROUP = jnp.array([0, 0, 0, 1, 1, 2, 0])
TRAJ = jnp.array([0, 0, 1, 2, 3, 4, 0])
VALID = jnp.array([1, 1, 1, 1, 1, 1, 0])


def _adv(normalize):
    return grpo_step_advantages(REWARD, GROUP, TRAJ, VALID, num_groups=3, num_trajs=5,
                                normalize=normalize, eps=1e-6)


def test_step_normalization_counts_every_step():
    # group 0 step rewards (1, 1, 0): mean 2/3, unbiased var ((1/3)^2 * 2 + (2/3)^2) / 2 = 1/3
    std = np.sqrt(1 / 3)
    want = [(1 / 3) / std, (1 / 3) / std, (-2 / 3) / std, 0, 0, 0, 0]
    np.testing.assert_allclose(_adv("step"), want, atol=1e-5)


def test_trajectory_normalization_counts_each_trajectory_once():
    # group 0 trajectory rewards (1, 0): mean 1/2, unbiased var 1/2
    s = np.sqrt(0.5)
    np.testing.assert_allclose(_adv("trajectory"), [0.5 / s, 0.5 / s, -0.5 / s, 0, 0, 0, 0],
                               atol=1e-5)


def test_trajectory_step_weights_give_each_trajectory_equal_total():
    # 6 valid steps, 5 trajectories: 6/5 per trajectory, split over its steps
    w = trajectory_step_weights(TRAJ, VALID, num_trajs=5)
    np.testing.assert_allclose(w, [0.6, 0.6, 1.2, 1.2, 1.2, 1.2, 0.0], atol=1e-6)
    assert abs(float(w.sum()) - 6.0) < 1e-5
