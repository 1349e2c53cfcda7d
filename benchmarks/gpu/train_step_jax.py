"""The train-step benchmark's worker for ours (benchmarks/gpu/train_step.py runs it):
`python -m benchmarks.gpu.train_step_jax --worker CASE_JSON` runs one case of framework "jax"
(compiled and stepped) or "jax-compile" (compiled only) and prints its figures as JSON lines."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import jax
import numpy as np
from flax import nnx

from benchmarks.gpu import memory_plan
from benchmarks.gpu.measure import device_peak_bytes, model_config, profiled, xla_bytes
from benchmarks.gpu.op_profile import jax_ops
from benchmarks.gpu.train_step import Case
from dart_jax.models.config import Qwen25VLConfig
from dart_jax.models.inputs import make_inputs
from dart_jax.models.qwen25vl import abstract_model, create_model
from dart_jax.models.sharding import make_mesh
from dart_jax.train.batch import TrainBatch, to_global
from dart_jax.train.config import OptimizerConfig, TrainerConfig
from dart_jax.train.step import RowTargets, Scores, TrainFunctions


def synthetic_batch(config: Qwen25VLConfig, rows: int, length: int, seed: int = 0):
    """A TrainBatch of random text tokens (no vision ids), every token attended and in the loss."""
    high = min(config.text.vocab_size, config.vision_start_token_id)
    ids = np.random.default_rng(seed).integers(0, high, (rows, length)).astype(np.int32)
    f32 = lambda v: np.full((rows, 1), v, np.float32)  # noqa: E731
    slot = np.arange(rows, dtype=np.int32)[:, None]  # one step a row
    return TrainBatch(make_inputs(config, ids), np.roll(ids, -1, axis=1), np.ones((rows, 1, length), np.float32),
                      np.zeros((rows, 1, length), np.float32), f32(0), slot, slot, f32(1), f32(1),
                      np.zeros((rows, 1), np.int32), np.ones((rows, 1), bool))


def run_jax(case: Case, dump: Path | None = None) -> dict:
    config = model_config(case.size)
    mesh = make_mesh(1, 1, 1)
    model = nnx.jit(lambda: create_model(config, dtype=case.dtype, remat=case.remat))()
    graphdef, params = nnx.split(model)
    cfg = TrainerConfig(mode="sft", compute_dtype=case.dtype, remat=case.remat, optimizer=OptimizerConfig(lr=1e-5))
    fns = TrainFunctions(graphdef, params, cfg, mesh)
    state = fns.init_state(params)
    del model, params
    mb = to_global(synthetic_batch(config, case.rows, case.length), mesh)
    ones = np.ones(case.rows, np.float32)  # one step slot a row
    ones = jax.device_put(ones, fns.row_shardings(ones))
    rows = RowTargets(ones, ones, Scores(None, None, None))

    def step(state):
        acc = fns.zeros(state.params, mb, rows)
        return fns.apply(state, fns.accumulate(state.params, acc, mb, rows))

    start = time.perf_counter()
    exe = fns.compile_accumulate(state.params, fns.accumulator_shapes(state.params, mb, rows), mb, rows)
    accumulate_compile = time.perf_counter() - start
    print(json.dumps({"device": jax.devices()[0].device_kind, "plan_bytes": xla_bytes(exe),
                      "accumulate_compile_s": accumulate_compile, **memory_plan.figures(dump)}), flush=True)
    start = time.perf_counter()
    state, metrics = step(state)
    jax.block_until_ready(metrics)
    first = time.perf_counter() - start
    times = []
    for _ in range(case.steps):
        start = time.perf_counter()
        state, metrics = step(state)
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - start)
    peak, source = device_peak_bytes(jax.devices()[0], exe)
    steady = statistics.median(times)
    result = {"step_s": steady, "compile_s": accumulate_compile + first - steady,
              "peak_bytes": peak, "peak_source": source, "loss": float(metrics["loss/total"])}
    if not case.profile:
        return result

    def traced() -> None:
        nonlocal state
        state, out = step(state)
        jax.block_until_ready(out)
    return profiled(result, jax_ops, traced)


def compile_jax(case: Case, dump: Path | None = None) -> dict:
    """Compile ours without running it (no parameter memory): XLA's memory analysis of the
    accumulate step (forward + backward) and the compile time, for shapes this host cannot run."""
    config = model_config(case.size)
    graphdef, params = abstract_model(config, dtype=case.dtype)
    cfg = TrainerConfig(mode="sft", compute_dtype=case.dtype, remat=case.remat)
    fns = TrainFunctions(graphdef, params, cfg, make_mesh(1, 1, 1))
    sds = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype)  # noqa: E731
    params = jax.tree.map(sds, params)
    mb = jax.tree.map(sds, synthetic_batch(config, case.rows, case.length))
    ones = jax.ShapeDtypeStruct((case.rows,), np.float32)
    rows = RowTargets(ones, ones, Scores(None, None, None))
    start = time.perf_counter()
    exe = fns.compile_accumulate(params, fns.accumulator_shapes(params, mb, rows), mb, rows)
    m = exe.memory_analysis()
    return {"compile_s": time.perf_counter() - start, "temp_bytes": m.temp_size_in_bytes,
            "argument_bytes": m.argument_size_in_bytes, "peak_bytes": xla_bytes(exe),
            "peak_source": "xla_memory_analysis", **memory_plan.figures(dump)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", required=True, help="the case, as JSON")
    case = Case(**json.loads(ap.parse_args().worker))
    run = {"jax": run_jax, "jax-compile": compile_jax}[case.framework]
    print(json.dumps(memory_plan.run_dumping(run, case, case.memory)))


if __name__ == "__main__":
    main()
