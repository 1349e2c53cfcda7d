"""Building blocks shared by the vision tower and the decoder.

Parameters are fp32 and carry `logical_axes` metadata (see sharding.py); each layer casts them to
its compute `dtype` at use. Kernels are `[in, out]` (torch Linear.weight is `[out, in]`).
"""

from __future__ import annotations


import jax
import jax.numpy as jnp
from flax import nnx

Dtype = jnp.dtype

_init = jax.nn.initializers.normal(0.02)

def param(rngs: nnx.Rngs | None, shape, axes, init=_init) -> nnx.Param:
    value = init(rngs.params(), shape, jnp.float32)
    return nnx.Param(value, logical_axes=tuple(axes))


class Linear(nnx.Module):
    def __init__(self, din: int, dout: int, *, axes, bias: bool, dtype, rngs: nnx.Rngs):
        self.kernel = param(rngs, (din, dout), axes)
        self.bias = param(rngs, (dout,), axes[1:], jax.nn.initializers.zeros) if bias else None
        self.dtype = dtype

    def __call__(self, x):
        y = jnp.dot(x.astype(self.dtype), self.kernel[...].astype(self.dtype))
        if self.bias is not None:
            y = y + self.bias[...].astype(self.dtype)
        return y


class RMSNorm(nnx.Module):
    """x / rms(x) in fp32, cast back, then scaled: the transformers order of operations."""

    def __init__(self, dim: int, *, eps: float, dtype, rngs: nnx.Rngs):
        self.weight = param(rngs, (dim,), ("norm",), jax.nn.initializers.ones)
        self.eps = eps
        self.dtype = dtype

    def __call__(self, x):
        x32 = x.astype(jnp.float32)
        x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return self.weight[...].astype(self.dtype) * x32.astype(self.dtype)


class SwiGLU(nnx.Module):
    """down(silu(gate(x)) * up(x)); attribute names as in transformers' Qwen2MLP."""

    def __init__(self, dim: int, hidden: int, *, bias: bool, axes: tuple[str, str], dtype, rngs: nnx.Rngs):
        emb, mlp = axes
        self.gate_proj = Linear(dim, hidden, axes=(emb, mlp), bias=bias, dtype=dtype, rngs=rngs)
        self.up_proj = Linear(dim, hidden, axes=(emb, mlp), bias=bias, dtype=dtype, rngs=rngs)
        self.down_proj = Linear(hidden, dim, axes=(mlp, emb), bias=bias, dtype=dtype, rngs=rngs)

    def __call__(self, x):
        return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))


def rotate_half(x):
    x1, x2 = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([-x2, x1], axis=-1)


def apply_rotary(x, cos, sin):
    """x * cos + rotate_half(x) * sin; cos/sin broadcast over the heads axis (-2)."""
    return x * cos[..., None, :] + rotate_half(x) * sin[..., None, :]
