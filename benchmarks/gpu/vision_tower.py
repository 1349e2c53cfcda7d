"""The vision tower's forward + backward on screenshots: peak device memory and time.

    python -m benchmarks.gpu.vision_tower                   # Qwen2.5-VL-7B's tower, 1 and 5 screenshots of 1920x1080
    python -m benchmarks.gpu.vision_tower --screenshots 5 --remat dots
    python -m benchmarks.gpu.vision_tower --dry             # a two-block tower on small screens (any host)

Each screenshot is resized as UI-TARS-1.5 resizes it (smart_resize within the `plan:`
section's pixel bounds, capacity/config.py) and laid out as the trainer lays it out (one row,
every attention window padded, models/inputs.py). One step is `jax.value_and_grad` of the
mean square of the merged visual tokens with respect to the tower's fp32 parameters, in the
trainer's compute dtype, remat policy and attention preference (train/config.py: the GPU and
TPU configs run bf16 with remat "full"; attention "auto"): what the decoder's gradient costs
the tower in a train step. Each case runs in its own process (benchmarks.common.run_worker
of the worker module benchmarks.gpu.vision_tower_jax), so an out-of-memory ends only its own
case and each peak is that case's own.

Figures per case: compile_s, step_s (median of `steps` after the first), peak_bytes
(the allocator's peak; on CPU, XLA's memory analysis), plan_bytes (XLA's memory analysis,
printed before the step runs, so it stands where the step does not fit). Last line: JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json

from benchmarks.common import machine, run_worker
from dart_jax.agent.image_processing import ImageProcessorConfig
from dart_jax.capacity.config import PlanConfig
from dart_jax.models.config import VisionConfig

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
    v, plan = TOWERS[case.tower], PlanConfig()
    image = ImageProcessorConfig(plan.min_pixels, plan.max_pixels, patch_size=v.patch_size,
                                 temporal_patch_size=v.temporal_patch_size, merge_size=v.spatial_merge_size)
    grid = image.grid_thw(case.height, case.width)
    return {"screen": [case.width, case.height], "resized_hw": list(image.resized_hw(case.height, case.width)),
            "grid_thw": list(grid), "patches": grid[0] * grid[1] * grid[2],
            "tokens": image.num_image_tokens(case.height, case.width)}


def measure(cases, timeout) -> list[dict]:
    """Each case in its own process; `timeout()` gives the seconds the next may take, or None
    to skip it."""
    results = []
    for case in cases:
        limit = timeout()
        res = {"status": "skipped: out of time"} if limit is None else run_worker(
            "benchmarks.gpu.vision_tower_jax", dataclasses.asdict(case), limit)
        results.append({"screenshots": case.screenshots, **geometry(case), **res})
    return results


def cases(dry: bool, screenshots=(1, 5), remat: str = "full", attention: str = "auto") -> list[Case]:
    plan = PlanConfig()
    width, height = DRY_SCREEN if dry else (plan.screen_width, plan.screen_height)
    return [Case("micro" if dry else "7B", n, width, height, remat=remat, attention=attention, steps=2 if dry else 3)
            for n in screenshots]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--screenshots", default="1,5")
    ap.add_argument("--remat", default="full")
    ap.add_argument("--attention", default="auto")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per case")
    ap.add_argument("--dry", action="store_true", help="a two-block tower on small screens")
    args = ap.parse_args()
    todo = cases(args.dry, [int(n) for n in args.screenshots.split(",")], args.remat, args.attention)
    results = measure(todo, lambda: args.timeout)
    print(json.dumps({"benchmark": "vision_tower", "tower": dataclasses.asdict(TOWERS[todo[0].tower]),
                      "dtype": todo[0].dtype, "remat": args.remat, "attention": args.attention,
                      "results": results, "machine": machine()}))


if __name__ == "__main__":
    main()
