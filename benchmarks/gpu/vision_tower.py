"""The vision tower's forward + backward on screenshots: peak device memory and time.

    python -m benchmarks.vision_tower                       # Qwen2.5-VL-7B's tower, 1 and 5 screenshots of 1920x1080
    python -m benchmarks.vision_tower --screenshots 5 --remat dots
    python -m benchmarks.vision_tower --dry                 # a two-block tower on small screens (any host)

Each screenshot is resized as UI-TARS-1.5 resizes it (smart_resize within the `plan:`
section's pixel bounds, capacity/config.py) and laid out as the trainer lays it out (one row,
every attention window padded, models/inputs.py). One step is `jax.value_and_grad` of the
mean square of the merged visual tokens with respect to the tower's fp32 parameters, in the
trainer's compute dtype, remat policy and attention preference (train/config.py: the GPU and
TPU configs run bf16 with remat "full"; attention "auto"): what the decoder's gradient costs
the tower in a train step. Each case runs in its own process (benchmarks.common.run_worker),
so an out-of-memory ends only its own case and each peak is that case's own.

Figures per case: compile_s, step_s (median of `steps` after the first), peak_bytes
(the allocator's peak; on CPU, XLA's memory analysis), plan_bytes (XLA's memory analysis,
printed before the step runs, so it stands where the step does not fit). Last line: JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path

import numpy as np

from benchmarks import memory_plan
from benchmarks.common import machine, run_worker
from dart_jax.capacity.config import PlanConfig
from dart_jax.models.config import Qwen25VLConfig, VisionConfig

# name -> the tower (7B: Qwen2.5-VL-7B's, the VisionConfig defaults: depth 32, hidden 1280,
# 16 heads, intermediate 3420, out 3584, full attention in blocks 7/15/23/31)
TOWERS = {
    "7B": VisionConfig(),
    "micro": VisionConfig(depth=2, hidden_size=64, intermediate_size=128, num_heads=2, fullatt_block_indexes=(1,)),
}
DRY_SCREEN = (448, 252)  # width, height: 16:9 at a size two CPU cores run in seconds


@dataclasses.dataclass(frozen=True)
class Case:
    tower: str
    screenshots: int
    width: int
    height: int
    dtype: str = "bfloat16"
    remat: str = "full"
    attention: str = "auto"
    steps: int = 3
    memory: bool = False  # also XLA's largest buffers of the plan (memory_plan), printed before it runs


def geometry(case: Case) -> dict:
    """How one screenshot of the case enters the tower: resized size, patch grid, tokens."""
    from dart_jax.agent.image_processing import ImageProcessorConfig

    v, plan = TOWERS[case.tower], PlanConfig()
    image = ImageProcessorConfig(plan.min_pixels, plan.max_pixels, patch_size=v.patch_size,
                                 temporal_patch_size=v.temporal_patch_size, merge_size=v.spatial_merge_size)
    grid = image.grid_thw(case.height, case.width)
    return {"screen": [case.width, case.height], "resized_hw": list(image.resized_hw(case.height, case.width)),
            "grid_thw": list(grid), "patches": grid[0] * grid[1] * grid[2],
            "tokens": image.num_image_tokens(case.height, case.width)}


def tower_inputs(case: Case, seed: int = 0):
    """The case's screenshots as the trainer's one-row ModelInputs (random pixels)."""
    from dart_jax.models.inputs import make_inputs

    config = Qwen25VLConfig(vision=TOWERS[case.tower])
    geo = geometry(case)
    n = case.screenshots
    one = [config.vision_start_token_id] + [config.image_token_id] * geo["tokens"] + [config.vision_end_token_id]
    ids = np.asarray([one * n], np.int64)
    pixels = np.random.default_rng(seed).standard_normal((n * geo["patches"], config.vision.patch_dim), np.float32)
    return make_inputs(config, ids, pixel_values=pixels, image_grid_thw=[geo["grid_thw"]] * n)


def run_case(case: Case, dump: Path | None = None) -> dict:
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    from dart_jax.models.vision import VisionTransformer
    from benchmarks.train_step import device_peak_bytes, xla_bytes

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
    peak, source = device_peak_bytes(exe)
    return {"step_s": statistics.median(times[1:]), "first_s": times[0], "peak_bytes": peak, "peak_source": source,
            "loss": float(value), "grad_norm": grad_norm}


def measure(cases, timeout) -> list[dict]:
    """Each case in its own process; `timeout()` gives the seconds the next may take, or None
    to skip it."""
    results = []
    for case in cases:
        limit = timeout()
        res = {"status": "skipped: out of time"} if limit is None else run_worker("benchmarks.vision_tower",
                                                                                  dataclasses.asdict(case), limit)
        results.append({"screenshots": case.screenshots, **geometry(case), **res})
    return results


def cases(dry: bool, screenshots=(1, 5), remat: str = "full", attention: str = "auto") -> list[Case]:
    plan = PlanConfig()
    width, height = DRY_SCREEN if dry else (plan.screen_width, plan.screen_height)
    return [Case("micro" if dry else "7B", n, width, height, remat=remat, attention=attention, steps=2 if dry else 3)
            for n in screenshots]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--screenshots", default="1,5")
    ap.add_argument("--remat", default="full")
    ap.add_argument("--attention", default="auto")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per case")
    ap.add_argument("--dry", action="store_true", help="a two-block tower on small screens")
    args = ap.parse_args()
    if args.worker:
        case = Case(**json.loads(args.worker))
        print(json.dumps(memory_plan.run_dumping(run_case, case, case.memory)))
        return
    todo = cases(args.dry, [int(n) for n in args.screenshots.split(",")], args.remat, args.attention)
    results = measure(todo, lambda: args.timeout)
    print(json.dumps({"benchmark": "vision_tower", "tower": dataclasses.asdict(TOWERS[todo[0].tower]),
                      "dtype": todo[0].dtype, "remat": args.remat, "attention": args.attention,
                      "results": results, "machine": machine()}))


if __name__ == "__main__":
    main()
