"""AdamW with global-norm clipping as one fused pass over the parameters.

Given the accumulated gradient sums G (the step divides by the global count n), step t
(1-based), learning rate lr_t and clip threshold c:

    g = G / n,  N = ||g||_2 (global),  g' = g * min(1, c / N)
    m <- b1 m + (1 - b1) g',  v <- b2 v + (1 - b2) g'^2
    p <- p - lr_t * ( (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) + wd * p )

which is optax's `chain(clip_by_global_norm(c), adamw(lr, b1, b2, eps, weight_decay=wd))`
(weight decay on every parameter, as there). The norm is one reduction over G; the rest is
one elementwise expression per parameter array (read G, m, v, p; write m, v, p): the floor is
8 fp32 words per parameter with the norm's read of G. XLA:CPU, which has no multi-output
fusion, makes one loop fusion per output and p's re-reads the new m and v: 11 words by its
cost analysis, where optax's chain of transformations takes 15. With stacked layers
(models/layer_scan.py) there are a few dozen arrays, not thousands, so no pass is a crowd of
tiny kernels.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax

from dart_jax.train.config import OptimizerConfig


@dataclasses.dataclass(frozen=True)
class AdamWState:
    count: jax.Array  # int32 []: updates done
    mu: object  # first moments, the parameters' tree (fp32)
    nu: object  # second moments


jax.tree_util.register_dataclass(AdamWState, data_fields=["count", "mu", "nu"], meta_fields=[])


def schedule_of(cfg: OptimizerConfig) -> optax.Schedule:
    """Learning rate by update count: constant / warmup + cosine / linear to 0 at total_steps."""
    warmup = optax.linear_schedule(0.0, cfg.lr, cfg.warmup_steps)
    if cfg.schedule == "constant":
        return optax.join_schedules([warmup, optax.constant_schedule(cfg.lr)], [cfg.warmup_steps])
    if cfg.schedule == "cosine":
        return optax.warmup_cosine_decay_schedule(0.0, cfg.lr, cfg.warmup_steps, cfg.total_steps)
    decay = optax.linear_schedule(cfg.lr, 0.0, cfg.total_steps - cfg.warmup_steps)
    return optax.join_schedules([warmup, decay], [cfg.warmup_steps])


def global_norm(grad_sums, scale: jax.Array) -> jax.Array:
    """||G * scale||_2 over every array (fp32)."""
    sq = [jnp.sum(jnp.square(g.astype(jnp.float32) * scale)) for g in jax.tree.leaves(grad_sums)]
    return jnp.sqrt(sum(sq))


@dataclasses.dataclass(frozen=True)
class FusedAdamW:
    """The formula above for one OptimizerConfig; the learning rate follows the update count."""
    cfg: OptimizerConfig

    def init(self, params) -> AdamWState:
        zeros = lambda: jax.tree.map(jnp.zeros_like, params)  # noqa: E731
        return AdamWState(jnp.zeros((), jnp.int32), zeros(), zeros())

    def lr(self, state: AdamWState) -> jax.Array:
        return schedule_of(self.cfg)(state.count)

    def update(self, params, state: AdamWState, grad_sums, scale: jax.Array) -> tuple[object, AdamWState, jax.Array]:
        """(params, state, ||G * scale||) after one step on the mean gradient G * scale."""
        cfg = self.cfg
        norm = global_norm(grad_sums, scale)
        factor = scale * jnp.where(norm < cfg.grad_clip, 1.0, cfg.grad_clip / norm)
        lr = self.lr(state)
        t = (state.count + 1).astype(jnp.float32)
        bc1, bc2 = 1 - cfg.b1**t, 1 - cfg.b2**t

        def one(g, m, v, p):
            g = g * factor
            m = cfg.b1 * m + (1 - cfg.b1) * g
            v = cfg.b2 * v + (1 - cfg.b2) * g * g
            step = (m / bc1) / (jnp.sqrt(v / bc2) + cfg.eps) + cfg.weight_decay * p
            return p - lr * step, m, v

        out = jax.tree.map(one, grad_sums, state.mu, state.nu, params)
        pick = lambda i: jax.tree.map(lambda _, o: o[i], params, out)  # noqa: E731
        return pick(0), AdamWState(state.count + 1, pick(1), pick(2)), norm
