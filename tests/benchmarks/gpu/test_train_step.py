"""The train-step benchmark's memory figure (XLA's plan of a compiled step) and its profile,
which never costs a case its figures."""

import json

import jax
import jax.numpy as jnp

from benchmarks.gpu.measure import profiled, xla_bytes
from benchmarks.gpu.train_step import Case

MIB = 1 << 20


def _plan(donate: bool) -> int:
    step = jax.jit(lambda acc, g: acc + g, donate_argnums=(0,) if donate else ())
    shape = jax.ShapeDtypeStruct((MIB // 4,), jnp.float32)  # 1 MiB each
    return xla_bytes(step.lower(shape, shape).compile())


def test_an_output_in_a_donated_arguments_buffer_is_counted_once():
    assert _plan(donate=False) >= 3 * MIB  # two arguments and a fresh output
    assert 2 * MIB <= _plan(donate=True) < 3 * MIB  # the sum is written over the accumulator


def test_a_profile_that_fails_leaves_the_figures_standing(capsys):
    def broken(step):
        raise RuntimeError("CUPTI could not be loaded")

    out = profiled({"step_s": 0.5}, broken, lambda: None)
    assert out == {"profile": {"error": "RuntimeError: CUPTI could not be loaded"}}
    assert json.loads(capsys.readouterr().out) == {"step_s": 0.5}  # printed before the trace began


def test_a_case_stopped_while_profiled_keeps_its_figures(monkeypatch):
    import benchmarks.gpu.train_step as ts

    case = Case("jax", "micro", 256, 2, 2, "bfloat16", "full", profile=True)
    monkeypatch.setattr(ts, "run_worker", lambda *a: {"step_s": 0.5, "peak_bytes": 7, "status": "timeout after 9 s"})
    assert ts.measure(case, 9) == {"step_s": 0.5, "peak_bytes": 7, "status": "ok",
                                   "profile": {"error": "timeout after 9 s"}}
    monkeypatch.setattr(ts, "run_worker", lambda *a: {"status": "timeout after 9 s"})  # stopped before its figures
    assert ts.measure(case, 9) == {"status": "timeout after 9 s"}
