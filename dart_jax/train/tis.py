"""Truncated importance sampling against the rollout engine's sampling logprobs.

The rollout engine (vLLM) and the trainer compute slightly different probabilities for the
same tokens; TIS reweights each token's policy loss by how much more likely the trainer
finds it, capped at C so one token cannot dominate (weights carry no gradient).
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

_MAX_LOG = 20.0


def tis_weights(logp_old_BxT: jax.Array, logp_rollout_BxT: jax.Array, mask_BxT: jax.Array, *,
                cap: float, level: Literal["token", "sequence"] = "token") -> jax.Array:
    """Stop-gradient importance weights [B, T] (0 off the mask).

    token:    w_bt = min(exp(logp_old_bt - logp_rollout_bt), C)
    sequence: w_b  = min(exp(sum_t m_bt (logp_old_bt - logp_rollout_bt)), C), on every token
    """
    d_BxT = jnp.where(mask_BxT > 0, logp_old_BxT - logp_rollout_BxT, 0.0)
    if level == "token":
        log_w = d_BxT
    elif level == "sequence":
        log_w = jnp.broadcast_to(d_BxT.sum(axis=-1, keepdims=True), d_BxT.shape)
    else:
        raise ValueError(f"unknown TIS level {level!r}")
    w = jnp.minimum(jnp.exp(jnp.minimum(log_w, _MAX_LOG)), cap)
    return jax.lax.stop_gradient(jnp.where(mask_BxT > 0, w, 0.0))


def step_weight_sums(logp_old_NxT: np.ndarray, logp_rollout_NxT: np.ndarray, sampled_NxT: np.ndarray, *,
                     cap: float, level: Literal["token", "sequence"] = "token") -> tuple[np.ndarray, np.ndarray]:
    """Host-side (numpy) `tis_weights` summed per step: (sum of the weights of each step's
    sampled tokens, their count), both float64 [N], for the trainer's per-task trace."""
    m = sampled_NxT > 0
    d = np.where(m, logp_old_NxT.astype(np.float64) - logp_rollout_NxT, 0.0)
    if level == "sequence":
        d = np.broadcast_to(d.sum(axis=-1, keepdims=True), d.shape)
    elif level != "token":
        raise ValueError(f"unknown TIS level {level!r}")
    w = np.minimum(np.exp(np.minimum(d, _MAX_LOG)), cap)
    return np.where(m, w, 0.0).sum(axis=-1), m.sum(axis=-1).astype(np.float64)


class MismatchSums(NamedTuple):
    """Additive statistics of the trainer's and the sampler's logprobs over masked tokens
    (exact under any split of the batch); `mismatch_metrics` turns them into the logged means."""
    n: jax.Array  # masked tokens
    abs_delta: jax.Array  # sum |x - y|
    truncated: jax.Array  # tokens whose weight is at the cap
    sx: jax.Array
    sy: jax.Array
    sxx: jax.Array
    syy: jax.Array
    sxy: jax.Array


def mismatch_sums(logp_old_BxT: jax.Array, logp_rollout_BxT: jax.Array, mask_BxT: jax.Array,
                  weight_BxT: jax.Array, cap: float) -> MismatchSums:
    """The sums of x = logp_old and y = logp_rollout over the mask; `weight_BxT` are the TIS
    weights with cap `cap` (a weight at the cap counts as truncated)."""
    m = (mask_BxT > 0).astype(jnp.float32)
    x = jnp.where(m > 0, logp_old_BxT, 0.0)
    y = jnp.where(m > 0, logp_rollout_BxT, 0.0)
    return MismatchSums(n=m.sum(), abs_delta=jnp.sum(m * jnp.abs(x - y)),
                        truncated=jnp.sum(m * (weight_BxT >= cap)), sx=x.sum(), sy=y.sum(),
                        sxx=jnp.sum(x * x), syy=jnp.sum(y * y), sxy=jnp.sum(x * y))


def mismatch_metrics(s: MismatchSums) -> dict[str, jax.Array]:
    """tis/abs_delta_logp: mean |logp_old - logp_rollout|; tis/truncated_frac: fraction of
    tokens whose weight hit the cap; tis/corr: Pearson correlation of the two logprobs."""
    n = jnp.maximum(s.n, 1.0)
    cov = s.sxy / n - s.sx * s.sy / n**2
    vx = s.sxx / n - (s.sx / n) ** 2
    vy = s.syy / n - (s.sy / n) ** 2
    return {"tis/abs_delta_logp": s.abs_delta / n, "tis/truncated_frac": s.truncated / n,
            "tis/corr": cov / jnp.sqrt(jnp.maximum(vx * vy, 1e-30))}
