"""The train-step benchmark's memory figure: XLA's plan of a compiled step."""

import jax
import jax.numpy as jnp

from benchmarks.train_step import xla_bytes

MIB = 1 << 20


def _plan(donate: bool) -> int:
    step = jax.jit(lambda acc, g: acc + g, donate_argnums=(0,) if donate else ())
    shape = jax.ShapeDtypeStruct((MIB // 4,), jnp.float32)  # 1 MiB each
    return xla_bytes(step.lower(shape, shape).compile())


def test_an_output_in_a_donated_arguments_buffer_is_counted_once():
    assert _plan(donate=False) >= 3 * MIB  # two arguments and a fresh output
    assert 2 * MIB <= _plan(donate=True) < 3 * MIB  # the sum is written over the accumulator
