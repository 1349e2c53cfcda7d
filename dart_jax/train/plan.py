"""Per-step decisions over a whole curated batch: GRPO advantages, entropy selection, weights.

They need every step of the batch (group statistics, a global top fraction), so they run
once per batch on small host arrays, before the first micro-batch's gradients. The arrays are
padded to a power of two, so this compiles O(log(batch size)) times, not once per batch.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from dart_jax.train.advantages import grpo_step_advantages, trajectory_step_weights
from dart_jax.train.config import TrainerConfig
from dart_jax.train.selection import top_entropy_steps


@dataclasses.dataclass(frozen=True)
class StepPlan:
    adv_N: np.ndarray  # float32: GRPO advantage of each step
    weight_N: np.ndarray  # float32: loss weight (0: not selected)
    metrics: dict[str, float]


def plan_steps(cfg: TrainerConfig, reward_N: np.ndarray, group_N: np.ndarray,
               traj_N: np.ndarray, entropy_N: np.ndarray | None) -> StepPlan:
    """Advantages and weights of the N steps of one batch (entropy_N: step mean entropies,
    needed when selection is enabled)."""
    n = len(reward_N)
    if cfg.selection.enabled and entropy_N is None:
        raise ValueError("entropy selection needs the steps' entropies")
    size = max(8, 1 << (n - 1).bit_length())
    pad = lambda x, dt: np.pad(np.asarray(x, dt), (0, size - n))  # noqa: E731
    ent = pad(np.zeros(n) if entropy_N is None else entropy_N, np.float32)
    adv, weight, metrics = _plan(
        pad(reward_N, np.float32), pad(group_N, np.int32), pad(traj_N, np.int32),
        pad(np.ones(n), np.float32), ent, normalize=cfg.loss.advantage_normalize,
        eps=cfg.loss.advantage_eps, fraction=cfg.selection.fraction if cfg.selection.enabled else 0.0)
    return StepPlan(np.asarray(adv)[:n], np.asarray(weight)[:n],
                    {k: float(v) for k, v in metrics.items()})


@functools.partial(jax.jit, static_argnames=("normalize", "eps", "fraction"))
def _plan(reward_S, group_S, traj_S, valid_S, entropy_S, *, normalize, eps, fraction):
    S = reward_S.shape[0]
    adv = grpo_step_advantages(reward_S, group_S, traj_S, valid_S, num_groups=S, num_trajs=S,
                               normalize=normalize, eps=eps)
    weight = (trajectory_step_weights(traj_S, valid_S, S) if normalize == "trajectory"
              else valid_S)
    metrics = {"adv/mean_abs": jnp.sum(jnp.abs(adv)) / jnp.maximum(valid_S.sum(), 1)}
    if fraction > 0:
        keep, sel = top_entropy_steps(entropy_S, valid_S, fraction)
        weight = weight * keep
        metrics |= sel
    return adv, weight, metrics
