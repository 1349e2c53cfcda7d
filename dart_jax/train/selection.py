"""High-entropy step selection (DART): train only on the steps where the policy was unsure.

A step's score is the mean entropy of its response tokens; the top `fraction` of the
batch's steps (rounded up, at least one) keep weight 1 and the rest get 0.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def step_mean_entropy(entropy_BxT: jax.Array, mask_BxT: jax.Array) -> jax.Array:
    """H_b = sum_t m_bt H_bt / sum_t m_bt (0 for rows without response tokens)."""
    n_B = mask_BxT.sum(axis=-1)
    return jnp.sum(jnp.where(mask_BxT > 0, entropy_BxT, 0.0), axis=-1) / jnp.maximum(n_B, 1.0)


def top_entropy_steps(step_entropy_S: jax.Array, valid_S: jax.Array,
                      fraction: float) -> tuple[jax.Array, dict[str, jax.Array]]:
    """keep_S in {0, 1}: the ceil(fraction * n_valid) valid steps of highest entropy.

    Ties break toward the earlier row. Metrics: kept fraction, the entropy threshold, and the
    mean entropy of kept and dropped steps.
    """
    valid = valid_S > 0
    n_valid = valid.sum()
    k = jnp.maximum(jnp.ceil(fraction * n_valid - 1e-6), jnp.minimum(n_valid, 1)).astype(jnp.int32)
    score = jnp.where(valid, step_entropy_S, -jnp.inf)
    order = jnp.argsort(-score, stable=True)
    rank_S = jnp.zeros_like(order).at[order].set(jnp.arange(order.shape[0]))
    keep = valid & (rank_S < k)
    dropped = valid & ~keep
    f = lambda sel: jnp.sum(jnp.where(sel, step_entropy_S, 0.0)) / jnp.maximum(sel.sum(), 1)  # noqa: E731
    metrics = {"select/kept_frac": keep.sum() / jnp.maximum(n_valid, 1),
               "select/threshold": jnp.min(jnp.where(keep, step_entropy_S, jnp.inf)),
               "select/entropy_kept": f(keep), "select/entropy_dropped": f(dropped)}
    return keep.astype(jnp.float32), jax.lax.stop_gradient(metrics)
