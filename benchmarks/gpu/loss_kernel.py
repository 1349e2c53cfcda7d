"""Fused log-prob/entropy kernel vs the full-logits reference: temp memory and wall time.

    python -m benchmarks.gpu.loss_kernel [--reps 3] [--chunk-tokens 1024] [--chunk-vocab 8192]
    python -m benchmarks.gpu.loss_kernel --hidden 3584 --vocab 152064 --tokens 16384 --dtype bfloat16 --auto-chunks

Both compile forward + backward of sum(a * logp) + sum(b * entropy) with gradients for the
hidden states [T, D] and the LM head [D, V] (default fp32, T = 4096, V = 151,936, D = 896).
Temp bytes are XLA's memory_analysis().temp_size_in_bytes; times are medians of interleaved
runs (naive, fused, naive, ...) so load from other processes hits both alike. The fused
kernel is also compiled (not run) at T = 32,768 to show its memory does not grow with T x V.
`--auto-chunks` takes the chunk sizes the trainer takes on this backend (kernels.auto_chunks).
Targets: naive/fused temp >= 6, fused_s <= naive_s, fused_temp_32k <= 1.25 x fused_temp.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp

from benchmarks.common import OOM_MARKERS, machine
from dart_jax.train.kernels import auto_chunks, naive_token_logprobs_entropy, token_logprobs_entropy

D, V = 896, 151_936


def _grad_fn(kernel, **kw):
    def loss(h_TxD, w_DxV, tok_T, a_T, b_T):
        logp_T, ent_T = kernel(h_TxD, w_DxV, tok_T, **kw)
        return jnp.sum(a_T * logp_T) + jnp.sum(b_T * ent_T)
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))


def _abstract(T, d=D, v=V, dtype="float32"):
    f32 = jnp.float32
    return (jax.ShapeDtypeStruct((T, d), dtype), jax.ShapeDtypeStruct((d, v), dtype),
            jax.ShapeDtypeStruct((T,), jnp.int32), jax.ShapeDtypeStruct((T,), f32),
            jax.ShapeDtypeStruct((T,), f32))


def _inputs(T, d=D, v=V, dtype="float32", seed=0):
    k = jax.random.split(jax.random.key(seed), 5)
    return (jax.random.normal(k[0], (T, d)).astype(dtype), (jax.random.normal(k[1], (d, v)) * 0.03).astype(dtype),
            jax.random.randint(k[2], (T,), 0, v), jax.random.normal(k[3], (T,)),
            jax.random.normal(k[4], (T,)))


def _time(compiled, args) -> float:
    start = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    return time.perf_counter() - start


def _temp(compiled) -> int:
    return compiled.memory_analysis().temp_size_in_bytes


def _rel_err(a, b) -> float:
    a, b = a.astype(jnp.float32), b.astype(jnp.float32)
    return float(jnp.linalg.norm(a - b) / jnp.maximum(jnp.linalg.norm(b), 1e-30))


def compare(tokens: int, hidden: int = D, vocab: int = V, dtype: str = "float32", *, chunk_tokens: int,
            chunk_vocab: int, reps: int = 3) -> dict:
    """Naive vs fused at one shape: XLA temp bytes, interleaved median times, the differences.
    A variant that does not fit the device is "out of memory" and the other still runs."""
    abstract = _abstract(tokens, hidden, vocab, dtype)
    kw = dict(chunk_tokens=chunk_tokens, chunk_vocab=chunk_vocab, entropy_grad=True)
    variants = {"naive": _grad_fn(naive_token_logprobs_entropy), "fused": _grad_fn(token_logprobs_entropy, **kw)}
    out = {"tokens": tokens, "vocab": vocab, "hidden": hidden, "dtype": dtype,
           "chunk_tokens": chunk_tokens, "chunk_vocab": chunk_vocab}
    x = _inputs(tokens, hidden, vocab, dtype)
    compiled, results = {}, {}
    for name, fn in variants.items():
        try:
            compiled[name] = fn.lower(*abstract).compile()
            out[f"{name}_temp_bytes"] = _temp(compiled[name])
            results[name] = jax.block_until_ready(compiled[name](*x))  # warm-up, and the check below
        except Exception as e:  # an out-of-memory is a figure; anything else is raised
            if not any(m in str(e) for m in OOM_MARKERS):
                raise
            compiled.pop(name, None)
            out[f"{name}_status"] = "out of memory"
    times = {name: [] for name in compiled}
    for _ in range(reps):
        for name, exe in compiled.items():
            times[name].append(_time(exe, x))
    for name, runs in times.items():
        out |= {f"{name}_status": "ok", f"{name}_s": statistics.median(runs), f"{name}_runs_s": runs}
    if len(results) == 2:
        (v_n, g_n), (v_f, g_f) = results["naive"], results["fused"]
        out |= {"loss_abs_diff": float(abs(v_n - v_f)), "max_grad_abs_diff": max(
                    float(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32)).max()) for a, b in zip(g_n, g_f)),
                "grad_rel_err": max(_rel_err(f, n) for f, n in zip(g_f, g_n)),
                "fused_over_naive_s": out["fused_s"] / out["naive_s"],
                "temp_ratio": out["naive_temp_bytes"] / out["fused_temp_bytes"]}
    return out


def fused_time(tokens: int, hidden: int, vocab: int, dtype: str, *, chunk_tokens: int, chunk_vocab: int,
               reps: int) -> dict:
    """The fused kernel alone at other chunk sizes: its median time and XLA temp bytes."""
    out = {"chunk_tokens": chunk_tokens, "chunk_vocab": chunk_vocab}
    fn = _grad_fn(token_logprobs_entropy, chunk_tokens=chunk_tokens, chunk_vocab=chunk_vocab, entropy_grad=True)
    try:
        exe = fn.lower(*_abstract(tokens, hidden, vocab, dtype)).compile()
        x = _inputs(tokens, hidden, vocab, dtype)
        jax.block_until_ready(exe(*x))
    except Exception as e:
        if not any(m in str(e) for m in OOM_MARKERS):
            raise
        return {**out, "status": "out of memory"}
    runs = [_time(exe, x) for _ in range(reps)]
    return {**out, "status": "ok", "fused_s": statistics.median(runs), "fused_temp_bytes": _temp(exe)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=D)
    ap.add_argument("--vocab", type=int, default=V)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--chunk-tokens", type=int, default=1024)
    ap.add_argument("--chunk-vocab", type=int, default=8192)
    ap.add_argument("--auto-chunks", action="store_true", help="the trainer's chunks for this backend and shape")
    args = ap.parse_args()
    ct, cv = ((auto_chunks(jax.default_backend(), args.tokens, args.vocab)) if args.auto_chunks
              else (args.chunk_tokens, args.chunk_vocab))
    out = compare(args.tokens, args.hidden, args.vocab, args.dtype, chunk_tokens=ct, chunk_vocab=cv, reps=args.reps)
    kw = dict(chunk_tokens=ct, chunk_vocab=cv, entropy_grad=True)
    abstract_32k = _abstract(32_768, args.hidden, args.vocab, args.dtype)
    fused_32k = _grad_fn(token_logprobs_entropy, **kw).lower(*abstract_32k).compile()
    out |= {"fused_temp_bytes_32k": _temp(fused_32k), "machine": machine(device=True)}
    out["temp_growth_32k"] = out["fused_temp_bytes_32k"] / out["fused_temp_bytes"]
    out["targets_met"] = (out.get("temp_ratio", 0) >= 6 and out.get("fused_over_naive_s", 2) <= 1
                          and out["temp_growth_32k"] <= 1.25)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
