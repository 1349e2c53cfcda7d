"""High-entropy step selection (DART): train only on the steps where the policy was unsure.

A step's score is the mean entropy of its response tokens. Within each cell of steps the
top `fraction` (rounded up, at least one) are kept, the rest get weight 0, and the kept
steps' weights are scaled so that the cell keeps its total sum_s w_s |A_s|:

    scope "batch":    one cell, the whole batch (DART's description, taken literally)
    scope "balanced": one cell per (GRPO group, sign of the advantage)

That rescale is selection's one compensation: the train step divides by the count of every
step in the batch, selected or not (step.rl_loss), so the gradient's scale does not depend on
how many steps a batch kept.

Why "balanced": GRPO's signed weights w_s A_s sum to zero over a group, so the tokens a
group's successes and failures share (the action format) get no net push. Dropping the
low-entropy steps of the whole batch drops mostly successes (a confident policy is
confident where it is right) and keeps the high-entropy garbage of failures, so the
batch's weight turns net negative and every shared token is pushed down: the action
format breaks (issue 30). Per (group, sign) with the mass restored, the sum stays zero.
Protected steps (the experience pool's injected successes) are always kept.
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp

Scope = Literal["batch", "balanced"]


def step_mean_entropy(entropy_BxT: jax.Array, mask_BxT: jax.Array) -> jax.Array:
    """H_b = sum_t m_bt H_bt / sum_t m_bt (0 for rows without response tokens)."""
    n_B = mask_BxT.sum(axis=-1)
    return jnp.sum(jnp.where(mask_BxT > 0, entropy_BxT, 0.0), axis=-1) / jnp.maximum(n_B, 1.0)


def top_entropy_steps(step_entropy_S: jax.Array, valid_S: jax.Array, fraction: float,
                      cell_S: jax.Array | None = None,
                      num_cells: int = 1) -> tuple[jax.Array, dict[str, jax.Array]]:
    """keep_S in {0, 1}: in each cell (`cell_S`, ids < num_cells; default one cell) the
    ceil(fraction * n_valid) valid steps of highest entropy, at least one.

    Ties break toward the earlier row. Metrics: kept fraction, the lowest kept entropy, and
    the mean entropy of kept and dropped steps.
    """
    S = step_entropy_S.shape[0]
    cell = jnp.zeros(S, jnp.int32) if cell_S is None else cell_S.astype(jnp.int32)
    valid = valid_S > 0
    score = jnp.where(valid, step_entropy_S, -jnp.inf)
    order = jnp.lexsort((jnp.arange(S), -score, cell))  # by cell, entropy down, then row
    pos_S = jnp.zeros(S, jnp.int32).at[order].set(jnp.arange(S, dtype=jnp.int32))
    first_C = jax.ops.segment_min(pos_S, cell, num_segments=num_cells)
    n_C = jax.ops.segment_sum(valid.astype(jnp.float32), cell, num_segments=num_cells)
    k_C = jnp.maximum(jnp.ceil(fraction * n_C - 1e-6), jnp.minimum(n_C, 1.0))
    keep = valid & (pos_S - first_C[cell] < k_C[cell])
    return keep.astype(jnp.float32), _metrics(step_entropy_S, valid, keep)


def select_steps(step_entropy_S: jax.Array, adv_S: jax.Array, weight_S: jax.Array, group_S: jax.Array,
                 valid_S: jax.Array, protect_S: jax.Array, *, fraction: float, scope: Scope,
                 num_groups: int) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The steps' loss weights after selection (the module docstring's two scopes):

        w'_s = w_s keep_s sum_c(w |A|) / sum_c(keep w |A|)   (c: the step's cell)
    A cell whose steps all have A = 0 keeps its kept steps' weights unscaled.
    """
    if scope == "balanced":
        cell = 2 * group_S.astype(jnp.int32) + (adv_S > 0)
        keep, metrics = top_entropy_steps(step_entropy_S, valid_S, fraction, cell, 2 * num_groups)
    elif scope == "batch":
        cell = jnp.zeros_like(group_S, jnp.int32)
        keep, metrics = top_entropy_steps(step_entropy_S, valid_S, fraction)
    else:
        raise ValueError(f"unknown selection scope {scope!r}")
    keep = jnp.maximum(keep, (protect_S > 0) & (valid_S > 0))
    w = weight_S * keep
    seg = lambda x: jax.ops.segment_sum(x, cell, num_segments=2 * num_groups)  # noqa: E731
    before_C, after_C = seg(weight_S * jnp.abs(adv_S)), seg(w * jnp.abs(adv_S))
    w = w * jnp.where(after_C > 0, before_C / jnp.maximum(after_C, 1e-30), 1.0)[cell]
    metrics["select/kept_frac"] = keep.sum() / jnp.maximum((valid_S > 0).sum(), 1)
    return w, jax.lax.stop_gradient(metrics)


def _metrics(entropy_S: jax.Array, valid: jax.Array, keep: jax.Array) -> dict[str, jax.Array]:
    dropped = valid & ~keep
    f = lambda sel: jnp.sum(jnp.where(sel, entropy_S, 0.0)) / jnp.maximum(sel.sum(), 1)  # noqa: E731
    return {"select/kept_frac": keep.sum() / jnp.maximum(valid.sum(), 1),
            "select/threshold": jnp.min(jnp.where(keep, entropy_S, jnp.inf)),
            "select/entropy_kept": f(keep), "select/entropy_dropped": f(dropped)}
