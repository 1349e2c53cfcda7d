"""Layers stacked along a leading axis and run under `lax.scan`, with remat by policy name.

A stack is one module whose parameters carry a leading `layers` axis (logical axis "layers",
never sharded), built by `nnx.vmap` over a layer constructor. The forward scans one traced
layer over that axis, so the program (and its compile time) does not grow with depth, and
`jax.checkpoint` around the scanned body is what makes remat take effect: inside a scan each
layer's recomputation cannot be merged with the forward, so only what the policy saves
(and the carry between layers) stays alive for the backward.

    layers = stacked(lambda rngs: DecoderLayer(cfg, dtype=dtype, rngs=rngs), n, rngs)
    x = scan(layers, x, lambda layer, x, xs: layer(x, ...), remat="full")
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from flax import nnx

# remat policy name -> jax.checkpoint policy ("none": no checkpoint, everything is saved)
REMAT_POLICIES: dict[str, Callable | None] = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.checkpoint_dots,
    "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    # weight-matmul outputs go to pinned host memory and come back for the backward
    "offload": jax.checkpoint_policies.offload_dot_with_no_batch_dims("device", "pinned_host"),
}


def check_remat(name: str) -> str:
    if name not in REMAT_POLICIES:
        raise ValueError(f"unknown remat policy {name!r}; choose from {sorted(REMAT_POLICIES)}")
    if name == "offload" and not _has_pinned_host():
        raise ValueError(f"remat 'offload' needs pinned host memory, which {jax.default_backend()} lacks")
    return name


def _has_pinned_host() -> bool:
    return any(m.kind == "pinned_host" for m in jax.devices()[0].addressable_memories())


def stacked(make: Callable[[nnx.Rngs], nnx.Module], n: int, rngs: nnx.Rngs) -> nnx.Module:
    """`n` independently initialized layers as one module with a leading axis on every parameter."""

    @nnx.split_rngs(splits=n)
    @nnx.vmap(in_axes=0, out_axes=0, transform_metadata={nnx.PARTITION_NAME: None, "logical_axes": "layers"})
    def build(rngs: nnx.Rngs) -> nnx.Module:
        return make(rngs)

    return build(rngs)


def scan(layers: nnx.Module, x, body: Callable[[nnx.Module, Any, Any], Any], remat: str, xs=None):
    """x after `body(layer_i, x, xs_i)` for each layer i in order (xs: per-layer inputs or None)."""
    graphdef, state = nnx.split(layers)

    def step(carry, per_layer):
        layer_state, xs_i = per_layer
        return body(nnx.merge(graphdef, layer_state), carry, xs_i), None

    policy = REMAT_POLICIES[check_remat(remat)]
    if remat != "none":
        step = jax.checkpoint(step, policy=policy, prevent_cse=False)
    out, _ = jax.lax.scan(step, x, (state, xs))
    return out
