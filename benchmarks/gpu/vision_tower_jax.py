"""The vision-tower benchmark's worker (benchmarks/gpu/vision_tower.py runs it):
`python -m benchmarks.gpu.vision_tower_jax --worker CASE_JSON` runs one case, forward +
backward of the tower on its screenshots, and prints its figures as JSON lines."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from benchmarks.gpu import memory_plan
from benchmarks.gpu.measure import device_peak_bytes, xla_bytes
from benchmarks.gpu.vision_tower import TOWERS, Case, geometry
from dart_jax.models.config import Qwen25VLConfig
from dart_jax.models.inputs import make_inputs
from dart_jax.models.vision import VisionTransformer


def tower_inputs(case: Case, seed: int = 0):
    """The case's screenshots as the trainer's one-row ModelInputs (random pixels)."""
    config = Qwen25VLConfig(vision=TOWERS[case.tower])
    geo = geometry(case)
    n = case.screenshots
    one = [config.vision_start_token_id] + [config.image_token_id] * geo["tokens"] + [config.vision_end_token_id]
    ids = np.asarray([one * n], np.int64)
    pixels = np.random.default_rng(seed).standard_normal((n * geo["patches"], config.vision.patch_dim), np.float32)
    return make_inputs(config, ids, pixel_values=pixels, image_grid_thw=[geo["grid_thw"]] * n)


def run_case(case: Case, dump: Path | None = None) -> dict:
    inputs = tower_inputs(case)
    cfg = TOWERS[case.tower]
    tower = nnx.jit(lambda: VisionTransformer(cfg, dtype=jnp.dtype(case.dtype), rngs=nnx.Rngs(0)))()
    graphdef, params = nnx.split(tower)
    del tower

    def loss(params, pixels, pos, seg):
        out = nnx.merge(graphdef, params)(pixels, pos, seg, remat=case.remat, impl=case.attention)
        return jnp.mean(jnp.square(out.astype(jnp.float32)))

    args = [jax.device_put(x) for x in (inputs.pixel_values, inputs.vision_position_ids, inputs.vision_segment_ids)]
    start = time.perf_counter()
    exe = jax.jit(jax.value_and_grad(loss)).lower(params, *args).compile()
    compile_s = time.perf_counter() - start
    print(json.dumps({"device": jax.devices()[0].device_kind, "slots": int(inputs.pixel_values.shape[1]),
                      "plan_bytes": xla_bytes(exe), "compile_s": compile_s, **memory_plan.figures(dump)}),
          flush=True)
    times = []
    for _ in range(case.steps + 1):
        start = time.perf_counter()
        value, grads = jax.block_until_ready(exe(params, *args))
        times.append(time.perf_counter() - start)
    grad_norm = float(optax.global_norm(grads))
    if not (np.isfinite(float(value)) and np.isfinite(grad_norm)):
        raise FloatingPointError("the tower's loss or gradient is not finite")
    peak, source = device_peak_bytes(jax.devices()[0], exe)
    return {"step_s": statistics.median(times[1:]), "first_s": times[0], "peak_bytes": peak, "peak_source": source,
            "loss": float(value), "grad_norm": grad_norm}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", required=True, help="the case, as JSON")
    case = Case(**json.loads(ap.parse_args().worker))
    print(json.dumps(memory_plan.run_dumping(run_case, case, case.memory)))


if __name__ == "__main__":
    main()
