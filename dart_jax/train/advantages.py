"""Step-wise GRPO advantages (DART): every step carries its trajectory's reward, normalized
over the task's group.

Inputs are per step (one row of the batch): the trajectory's reward, its group (task) id and
its trajectory id, plus `valid_S` (0 for padding rows). Pure jnp; `num_groups` and
`num_trajs` are static upper bounds on the ids.
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp


def grpo_step_advantages(reward_S: jax.Array, group_S: jax.Array, traj_S: jax.Array,
                         valid_S: jax.Array, *, num_groups: int, num_trajs: int,
                         normalize: Literal["step", "trajectory"] = "step",
                         eps: float = 1e-6) -> jax.Array:
    """A_s = (R_s - mean_g) / (std_g + eps), 0 for padding rows and single-member groups.

    normalize="step": mean_g and std_g run over the group's steps, so a trajectory with more
      steps counts more (DART's release).
    normalize="trajectory": they run over the group's trajectories, each counted once.
    std is the unbiased (n - 1) standard deviation, as in the release (torch.std).
    """
    if normalize == "step":
        member_S = valid_S.astype(jnp.float32)
    elif normalize == "trajectory":
        member_S = first_step_of_trajectory(traj_S, valid_S, num_trajs)
    else:
        raise ValueError(f"unknown advantage normalization {normalize!r}")
    seg = lambda x: jax.ops.segment_sum(x, group_S, num_segments=num_groups)  # noqa: E731
    n_G = seg(member_S)
    mean_G = seg(member_S * reward_S) / jnp.maximum(n_G, 1.0)
    var_G = seg(member_S * (reward_S - mean_G[group_S]) ** 2) / jnp.maximum(n_G - 1.0, 1.0)
    adv_S = (reward_S - mean_G[group_S]) / (jnp.sqrt(var_G)[group_S] + eps)
    keep = (valid_S > 0) & (n_G[group_S] > 1)
    return jnp.where(keep, adv_S, 0.0)


def first_step_of_trajectory(traj_S: jax.Array, valid_S: jax.Array, num_trajs: int) -> jax.Array:
    """1.0 on the first valid row of each trajectory, else 0 (one vote per trajectory)."""
    idx_S = jnp.arange(traj_S.shape[0])
    big = traj_S.shape[0]
    first_J = jax.ops.segment_min(jnp.where(valid_S > 0, idx_S, big), traj_S,
                                  num_segments=num_trajs)
    return ((first_J[traj_S] == idx_S) & (valid_S > 0)).astype(jnp.float32)


def trajectory_step_weights(traj_S: jax.Array, valid_S: jax.Array, num_trajs: int) -> jax.Array:
    """w_s = (S / J) / n_traj(s): each trajectory's steps share equal total weight, mean 1.

    S is the number of valid steps and J the number of trajectories with a valid step.
    """
    v_S = (valid_S > 0).astype(jnp.float32)
    n_J = jax.ops.segment_sum(v_S, traj_S, num_segments=num_trajs)
    S, J = v_S.sum(), (n_J > 0).sum()
    return v_S * (S / jnp.maximum(J, 1)) / jnp.maximum(n_J[traj_S], 1.0)
