"""Train-step throughput, MFU, peak memory and compile time: ours (JAX) vs transformers + torch.

    python -m benchmarks.train_step                          # GPU/TPU: 0.5B..7B x 4k/8k/32k; CPU: tiny
    python -m benchmarks.train_step --sizes 0.5B,1.5B --lengths 4096 --steps 5 --remat full
    python -m benchmarks.train_step --compile-only --sizes 0.5B --lengths 4096 --remat none  # any host

One step is an SFT update on `rows` sequences of `length` tokens (rows = tokens_per_step /
length, at least 1): forward, backward, global-norm clip and AdamW, fp32 master weights with
`--dtype` compute (bf16 off CPU). Ours is `train.step.TrainFunctions` (scanned layers, remat policy,
attention kernel chosen per backend, fused log-prob kernel, fused AdamW). The reference is
transformers' Qwen2_5_VLForConditionalGeneration on the same shapes: SDPA attention, gradient
checkpointing, autocast to the compute dtype, clip_grad_norm_, AdamW (fused on CUDA). Both
models carry a one-block vision tower that text-only steps do not run.

Each (framework, size, length) runs in its own process (no allocator shared between JAX and
torch; an out-of-memory kills only its own measurement); this driver never starts a device
backend itself (on a GPU JAX would take 75% of its memory before the first worker runs).
Figures: tokens/s (median step), MFU = tokens/s * flops_per_token / peak (formula in the
output; recomputation not counted; peak by the device's name), peak device memory (JAX
memory_stats / torch max_memory_allocated; on CPU, XLA's memory analysis of our compiled
step), compile time (first step minus a steady one; ours: plus the accumulate step's
compile, done ahead so that XLA's memory plan is printed even when the step does not fit:
`plan_bytes`). With `--profile`, two more steps of each are traced: where the time goes, by
operation and kind (benchmarks/op_profile.py); with `--memory`, the largest buffers of XLA's
plan of our step, printed before it runs (benchmarks/memory_plan.py). The last line is JSON
with every figure and the machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks import memory_plan
from benchmarks.common import run_worker
from benchmarks.op_profile import jax_ops, torch_ops
from dart_jax.models.config import Qwen25VLConfig, TextConfig, VisionConfig

# name -> (hidden, intermediate, layers, heads, kv heads, vocab, tied): Qwen2.5(-VL) decoders
SIZES = {
    "micro": (64, 128, 2, 2, 1, 1024, True),  # the GPU suite's dry run
    "tiny": (256, 512, 4, 4, 2, 8192, True),
    "0.5B": (896, 4864, 24, 14, 2, 151_936, True),
    "1.5B": (1536, 8960, 28, 12, 2, 151_936, True),
    "3B": (2048, 11008, 36, 16, 2, 151_936, True),
    "7B": (3584, 18944, 28, 28, 4, 152_064, False),
}
# dense bf16 FLOP/s by device name: the first key found in the device's name counts (PCIe before SXM)
PEAK_FLOPS = {"H100 PCIe": 756e12, "H100": 989e12, "H200": 989e12, "A100": 312e12, "TPU v4": 275e12,
              "TPU v5 lite": 197e12, "TPU v5p": 459e12, "TPU v6": 918e12}
FORMULA = "flops_per_token = 6 * N_matmul + 6 * layers * length * heads * head_dim (causal attention, fwd+bwd)"


def model_config(size: str) -> Qwen25VLConfig:
    d, inter, layers, heads, kv, vocab, tied = SIZES[size]
    half = d // heads // 2
    side = (half - half // 4) // 2
    text = TextConfig(vocab_size=vocab, hidden_size=d, intermediate_size=inter, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv, mrope_section=(half - 2 * side, side, side))
    vision = VisionConfig(depth=1, hidden_size=64, intermediate_size=128, num_heads=2, out_hidden_size=d,
                          fullatt_block_indexes=(0,))
    return Qwen25VLConfig(text=text, vision=vision, tie_word_embeddings=tied)


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


# ---- ours -----------------------------------------------------------------------------

def synthetic_batch(config: Qwen25VLConfig, rows: int, length: int, seed: int = 0):
    """A TrainBatch of random text tokens (no vision ids), every token attended and in the loss."""
    from dart_jax.models.inputs import make_inputs
    from dart_jax.train.batch import TrainBatch

    high = min(config.text.vocab_size, config.vision_start_token_id)
    ids = np.random.default_rng(seed).integers(0, high, (rows, length)).astype(np.int32)
    f32 = lambda v: np.full((rows, 1), v, np.float32)  # noqa: E731
    slot = np.arange(rows, dtype=np.int32)[:, None]  # one step a row
    return TrainBatch(make_inputs(config, ids), np.roll(ids, -1, axis=1), np.ones((rows, 1, length), np.float32),
                      np.zeros((rows, 1, length), np.float32), f32(0), slot, slot, f32(1), f32(1),
                      np.zeros((rows, 1), np.int32), np.ones((rows, 1), bool))


def run_jax(case: Case, dump: Path | None = None) -> dict:
    import jax
    from flax import nnx

    from dart_jax.models.qwen25vl import create_model
    from dart_jax.models.sharding import make_mesh
    from dart_jax.train.config import OptimizerConfig, TrainerConfig
    from dart_jax.train.batch import to_global
    from dart_jax.train.step import RowTargets, Scores, TrainFunctions

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
    peak, source = device_peak_bytes(exe)
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


def device_peak_bytes(exe) -> tuple[int, str]:
    """(bytes, source): the device allocator's peak, or where it keeps none (CPU) XLA's memory
    analysis of `exe`, the compiled step."""
    import jax

    peak = (jax.devices()[0].memory_stats() or {}).get("peak_bytes_in_use")
    return (int(peak), "memory_stats") if peak is not None else (xla_bytes(exe), "xla_memory_analysis")


def xla_bytes(exe) -> int:
    """What XLA's plan of `exe` holds at once: arguments, outputs and temporaries, an output
    that reuses a donated argument's buffer (the gradient accumulator) counted once."""
    m = exe.memory_analysis()
    return m.temp_size_in_bytes + m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes


def compile_jax(case: Case, dump: Path | None = None) -> dict:
    """Compile ours without running it (no parameter memory): XLA's memory analysis of the
    accumulate step (forward + backward) and the compile time, for shapes this host cannot run."""
    import jax

    from dart_jax.models.qwen25vl import abstract_model
    from dart_jax.models.sharding import make_mesh
    from dart_jax.train.config import TrainerConfig
    from dart_jax.train.step import RowTargets, Scores, TrainFunctions

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


# ---- transformers + torch -------------------------------------------------------------

def run_torch(case: Case) -> dict:
    import torch
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    hf_config = Qwen2_5_VLConfig(**model_config(case.size).to_hf())
    hf_config._attn_implementation = "sdpa"
    with torch.device(device):
        model = Qwen2_5_VLForConditionalGeneration(hf_config).train()
    model.gradient_checkpointing_enable()
    model.config.use_cache = False
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.1, fused=cuda)
    gen = torch.Generator(device).manual_seed(0)
    ids = torch.randint(0, hf_config.text_config.vocab_size, (case.rows, case.length), device=device, generator=gen)
    compute = getattr(torch, case.dtype)

    def step() -> float:
        with torch.autocast(device, dtype=compute, enabled=compute != torch.float32):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 2.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss)  # waits for the device

    start = time.perf_counter()
    step()
    first = time.perf_counter() - start
    times = []
    for _ in range(case.steps):
        start = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - start)
    peak = int(torch.cuda.max_memory_allocated()) if cuda else None
    result = {"step_s": statistics.median(times), "compile_s": first - statistics.median(times),
              "peak_bytes": peak, "peak_source": "max_memory_allocated" if cuda else None, "loss": loss,
              "device": torch.cuda.get_device_name() if cuda else "cpu"}
    return profiled(result, torch_ops, step) if case.profile else result


def profiled(result: dict, trace, step) -> dict:
    """The profile of `step`, the figures printed first: a trace that fails or outlives the
    case's time loses no figure (`measure` reads them back either way)."""
    print(json.dumps(result), flush=True)
    try:
        return {"profile": trace(step)}
    except Exception as e:  # a profiler the host lacks (no CUPTI) leaves the figures standing
        return {"profile": {"error": f"{type(e).__name__}: {e}"[:300]}}


# ---- driver ---------------------------------------------------------------------------

def measure(case: Case, timeout: float) -> dict:
    """One case in a fresh process: its figures, or why there are none. A case stopped while
    it was being profiled keeps its figures; its profile says why it has none."""
    res = run_worker("benchmarks.train_step", dataclasses.asdict(case), timeout)
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


_PROBE = ("import json, jax; d = jax.devices()[0]; print(json.dumps({'backend': jax.default_backend(), "
          "'device': d.device_kind, 'devices': jax.device_count(), 'jax': jax.__version__}))")


def machine() -> dict:
    """This host and its accelerator, asked in a child process (the device is left free)."""
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=300, check=True)
    return {"host": platform.node(), "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            **json.loads(out.stdout.strip().splitlines()[-1])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
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
    if args.worker:
        case = Case(**json.loads(args.worker))
        if case.framework == "torch":
            print(json.dumps(run_torch(case)))
        else:
            run = {"jax": run_jax, "jax-compile": compile_jax}[case.framework]
            print(json.dumps(memory_plan.run_dumping(run, case, case.memory)))
        return
    info = machine()
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
