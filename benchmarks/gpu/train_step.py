"""Train-step throughput, MFU, peak memory and compile time: ours (JAX) vs transformers + torch.

    python -m benchmarks.gpu.train_step                      # GPU/TPU: 0.5B..7B x 4k/8k/32k; CPU: tiny
    python -m benchmarks.gpu.train_step --sizes 0.5B,1.5B --lengths 4096 --steps 5 --remat full
    python -m benchmarks.gpu.train_step --compile-only --sizes 0.5B --lengths 4096 --remat none  # any host

One step is an SFT update on `rows` sequences of `length` tokens (rows = tokens_per_step /
length, at least 1): forward, backward, global-norm clip and AdamW, fp32 master weights with
`--dtype` compute (bf16 off CPU). Ours is `train.step.TrainFunctions` (scanned layers, remat policy,
attention kernel chosen per backend, fused log-prob kernel, fused AdamW). The reference is
transformers' Qwen2_5_VLForConditionalGeneration on the same shapes: SDPA attention, gradient
checkpointing, autocast to the compute dtype, clip_grad_norm_, AdamW (fused on CUDA). Both
models carry a one-block vision tower that text-only steps do not run.

Each (framework, size, length) runs in its own process, its framework's worker module
(train_step_jax, train_step_torch: no allocator shared between JAX and torch; an
out-of-memory kills only its own measurement); this driver never starts a device backend
itself (on a GPU JAX would take 75% of its memory before the first worker runs).
Figures: tokens/s (median step), MFU = tokens/s * flops_per_token / peak (formula in the
output; recomputation not counted; peak by the device's name), peak device memory (JAX
memory_stats / torch max_memory_allocated; on CPU, XLA's memory analysis of our compiled
step), compile time for ours (the accumulate step's compile, done ahead so that XLA's memory
plan is printed even when the step does not fit: `plan_bytes`, plus the first step minus a
steady one); eager torch compiles nothing: `warmup_s` is its first step minus a steady one.
With `--profile`, two more steps of each are traced: where the time goes, by operation and kind (benchmarks/gpu/op_profile.py); with `--memory`, the largest buffers of
XLA's plan of our step, printed before it runs (benchmarks/gpu/memory_plan.py). The last
line is JSON with every figure and the machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from benchmarks.common import machine, run_worker
from benchmarks.gpu.measure import SIZES, model_config
from dart_jax.models.config import Qwen25VLConfig

# dense bf16 FLOP/s by device name: the first key found in the device's name counts (PCIe before SXM)
PEAK_FLOPS = {"H100 PCIe": 756e12, "H100": 989e12, "H200": 989e12, "A100": 312e12, "TPU v4": 275e12,
              "TPU v5 lite": 197e12, "TPU v5p": 459e12, "TPU v6": 918e12}
FORMULA = "flops_per_token = 6 * N_matmul + 6 * layers * length * heads * head_dim (causal attention, fwd+bwd)"
WORKERS = {"jax": "benchmarks.gpu.train_step_jax", "jax-compile": "benchmarks.gpu.train_step_jax",
           "torch": "benchmarks.gpu.train_step_torch"}


def flops_per_token(config: Qwen25VLConfig, length: int) -> float:
    t = config.text
    attn_width = t.num_attention_heads * t.head_dim
    kv_width = t.num_key_value_heads * t.head_dim
    per_layer = t.hidden_size * (2 * attn_width + 2 * kv_width) + 3 * t.hidden_size * t.intermediate_size
    n_matmul = t.num_hidden_layers * per_layer + t.hidden_size * t.vocab_size
    return 6 * n_matmul + 6 * t.num_hidden_layers * length * attn_width


def peak_flops(device_kind: str, override: float | None) -> float | None:
    if override:
        return override * 1e12
    return next((v for k, v in PEAK_FLOPS.items() if k in device_kind), None)


@dataclasses.dataclass(frozen=True)
class Case:
    framework: str  # "jax" | "jax-compile" | "torch"
    size: str
    length: int
    rows: int
    steps: int
    dtype: str
    remat: str
    profile: bool = False  # also trace two more steps: where the time goes, by operation (op_profile)
    memory: bool = False  # also XLA's largest buffers of our step (memory_plan), printed before it runs


def measure(case: Case, timeout: float) -> dict:
    """One case in a fresh process: its figures, or why there are none. A case stopped while
    it was being profiled keeps its figures; its profile says why it has none."""
    res = run_worker(WORKERS[case.framework], dataclasses.asdict(case), timeout)
    if case.profile and res["status"] != "ok" and "step_s" in res and "profile" not in res:
        res = {**res, "status": "ok", "profile": {"error": res["status"]}}
    return res


def summarize(case: Case, res: dict, peak_tflops: float | None = None) -> dict:
    """The worker's figures plus tokens/s and MFU (peak by the device the worker reported)."""
    if res["status"] != "ok" or "step_s" not in res:
        return res
    peak = peak_flops(res.get("device", ""), peak_tflops)
    tokens = case.rows * case.length
    tps = tokens / res["step_s"]
    mfu = tps * flops_per_token(model_config(case.size), case.length) / peak if peak else None
    return {**res, "tokens_per_s": tps, "mfu": mfu, "peak_flops": peak}


def measure_row(size: str, length: int, tokens_per_step: int, frameworks, *, steps: int, dtype: str,
                remat: str, timeout, peak_tflops: float | None = None, profile: bool = False,
                memory: bool = False) -> dict:
    """Every framework on one (size, length), each in its own process, and ours over theirs.
    `timeout()` gives the seconds the next case may take, or None to skip it; `profile` adds
    each framework's time by operation, `memory` the largest buffers of our step's plan."""
    row = {"size": size, "length": length, "rows": max(1, tokens_per_step // length)}
    for fw in frameworks:
        case = Case(fw, size, length, row["rows"], steps, dtype, remat, profile, memory)
        limit = timeout()
        skipped = {"status": "skipped: out of time"}
        row[fw] = skipped if limit is None else summarize(case, measure(case, limit), peak_tflops)
    ours, ref = row.get("jax", {}), row.get("torch", {})
    if ours.get("status") == ref.get("status") == "ok":
        row["speedup_vs_torch"] = ours["tokens_per_s"] / ref["tokens_per_s"]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", help=f"comma-separated, from {list(SIZES)} (default: tiny on CPU, else 0.5B..7B)")
    ap.add_argument("--lengths", help="comma-separated tokens per sequence (default: 512,1024 on CPU, else 4096,8192,32768)")
    ap.add_argument("--tokens-per-step", type=int, help="rows = this / length (default 2048 on CPU, else 32768)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--dtype", help="compute dtype (default: float32 on CPU, else bfloat16)")
    ap.add_argument("--remat", default="full")
    ap.add_argument("--frameworks", default="jax,torch")
    ap.add_argument("--peak-tflops", type=float, help="peak dense TFLOP/s of the device, for MFU where unknown")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per measurement")
    ap.add_argument("--profile", action="store_true", help="trace two more steps: time by operation")
    ap.add_argument("--memory", action="store_true", help="XLA's largest buffers of our step's plan")
    ap.add_argument("--compile-only", action="store_true",
                    help="ours only, compiled not run: XLA's memory analysis and compile time")
    args = ap.parse_args()
    info = machine(device=True)
    small = info["backend"] == "cpu" and not args.compile_only  # compiling needs no device memory
    sizes = (args.sizes or ("tiny" if small else "0.5B,1.5B,3B,7B")).split(",")
    lengths = [int(x) for x in (args.lengths or ("512,1024" if small else "4096,8192,32768")).split(",")]
    per_step = args.tokens_per_step or (2048 if small else 32768)
    dtype = args.dtype or ("float32" if small else "bfloat16")
    peak = peak_flops(info["device"], args.peak_tflops)
    frameworks = ["jax-compile"] if args.compile_only else args.frameworks.split(",")
    results = []
    for size in sizes:
        for length in lengths:
            row = measure_row(size, length, per_step, frameworks, steps=args.steps, dtype=dtype, remat=args.remat,
                              timeout=lambda: args.timeout, peak_tflops=args.peak_tflops,
                              profile=args.profile, memory=args.memory)
            print(json.dumps(row), file=sys.stderr, flush=True)
            results.append(row)
    print(json.dumps({"benchmark": "train_step", "formula": FORMULA, "peak_flops": peak, "dtype": dtype,
                      "remat": args.remat, "tokens_per_step": per_step, "results": results, "machine": info}))


if __name__ == "__main__":
    main()
