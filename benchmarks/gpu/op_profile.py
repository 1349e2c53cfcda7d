"""Where a step's time goes, by operation: a few steps traced under the framework's own
profiler (JAX's `jax.profiler`, torch's `torch.profiler`), summed by operation and by kind
(matmul, attention, collective, copy, other), small enough to travel in a benchmark's JSON.

A figure that misses its target (MFU, ours over transformers + torch) then comes with the
reason from the same run: the share of the step the device spent in matmuls, in attention,
in everything else, and how much of the step it was busy at all. A GPU's time is its
kernels' (the device plane); on CPU, XLA's operations on the host's executor threads.
"""

from __future__ import annotations

import collections
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

TOP = 15  # operations kept, by time
# (kind, words in an operation's or kernel's name), first match wins: attention kernels often
# name a gemm inside them, so attention is asked first
KINDS = (
    ("attention", ("fmha", "sdpa", "flash", "cudnn", "splash", "attention", "scaled_dot_product")),
    ("collective", ("nccl", "all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective")),
    ("matmul", ("gemm", "cublas", "xmma", "cutlass", "matmul", "dot", "aten::mm", "addmm", "bmm")),
    ("copy", ("memcpy", "memset", "copy", "dynamic-update-slice", "transpose")),
)


def kind(*names: str) -> str:
    text = " ".join(names).lower()
    return next((k for k, words in KINDS if any(w in text for w in words)), "other")


def summarize(times: dict[str, float], counts: dict[str, int], kernels: dict[str, str], steps: int,
              wall_s: float, source: str) -> dict:
    """Per step: wall time, busy time (the operations' sum), seconds by kind, the top operations."""
    busy = sum(times.values())
    kinds = {op: kind(op, kernels.get(op, "")) for op in times}
    by_kind: dict[str, float] = collections.Counter()
    for op, s in times.items():
        by_kind[kinds[op]] += s
    top = sorted(times, key=times.get, reverse=True)[:TOP]
    return {
        "source": source, "steps": steps, "wall_s": wall_s / steps, "busy_s": busy / steps,
        "busy_share": busy / wall_s if wall_s else None,
        "by_kind_s": {k: v / steps for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
        "top": [{"op": op, "kernel": kernels.get(op, ""), "kind": kinds[op],
                 "s": times[op] / steps, "calls": counts[op] // steps,
                 "share": times[op] / busy if busy else None} for op in top],
    }


# ---- JAX -------------------------------------------------------------------------------

def jax_ops(step: Callable[[], None], steps: int = 2) -> dict:
    """Trace `steps` calls of `step` (each blocks until its results are ready) and sum XLA's
    operations: on a device plane where there is one (its kernels, by the HLO operation that
    launched them), else on the host's XLA threads."""
    import jax

    with tempfile.TemporaryDirectory(prefix="op_profile_") as d:
        with jax.profiler.trace(d):
            start = time.perf_counter()
            for _ in range(steps):
                step()
            wall = time.perf_counter() - start
        (path,) = Path(d).glob("**/*.xplane.pb")
        profile = jax.profiler.ProfileData.from_file(str(path))
        return summarize(*_xla_op_times(profile), steps=steps, wall_s=wall, source=_source(profile))


# lines a profiler derives from a device's kernels (the same time again) or that are not kernels
DERIVED = frozenset({"XLA Ops", "Async XLA Ops", "XLA Modules", "XLA TraceMe", "Steps", "Framework Ops",
                     "Framework Name Scope", "TensorFlow Ops", "TensorFlow Name Scope", "Source code"})


def _planes(profile) -> list:
    """The device planes that recorded anything, else the host's (a CPU backend runs XLA's
    operations on the host's threads)."""
    devices = [p for p in profile.planes if p.name.startswith("/device:") and any(l.events for l in _op_lines(p))]
    return devices or [p for p in profile.planes if p.name == "/host:CPU"]


def _source(profile) -> str:
    return ", ".join(p.name for p in _planes(profile))


def _op_lines(plane) -> list:
    """A device plane's "XLA Ops" line where it has one (TPUs, some GPU builds): each
    operation once. Else its stream lines, without the lines derived from them."""
    named = [line for line in plane.lines if line.name == "XLA Ops"]
    return named or [line for line in plane.lines if line.name not in DERIVED]


def _xla_op_times(profile) -> tuple[dict[str, float], dict[str, int], dict[str, str]]:
    """Each operation's own time: an operation that holds others on its line (a while loop
    around its body on CPU) counts only the time its inner operations leave. A device's kernel
    counts under the HLO operation that launched it, or its own name where the trace does not
    say (a kernel replayed from a CUDA graph); on the host only XLA's operations count."""
    times: dict[str, float] = collections.Counter()
    counts: dict[str, int] = collections.Counter()
    kernels: dict[str, str] = {}
    for plane in _planes(profile):
        device = plane.name.startswith("/device:")
        for line in _op_lines(plane):
            ops = sorted(((e.start_ns, e.duration_ns, str(op), e.name) for e in line.events
                          if (op := dict(e.stats).get("hlo_op") or (e.name if device else None)) is not None),
                         key=lambda o: (o[0], -o[1]))
            open_: list[tuple[float, str]] = []  # (end, op) of the operations enclosing this one
            for start, duration, op, name in ops:
                while open_ and open_[-1][0] <= start:
                    open_.pop()
                if open_:
                    times[open_[-1][1]] -= duration / 1e9
                times[op] += duration / 1e9
                counts[op] += 1
                kernels.setdefault(op, name)
                open_.append((start + duration, op))
    return times, counts, kernels


# ---- torch -----------------------------------------------------------------------------

def torch_ops(step: Callable[[], None], steps: int = 2) -> dict:
    """Trace `steps` calls of `step` under torch.profiler and sum each operation's own time:
    on CUDA its kernels' device time, else its CPU time."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            step()
        if cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - start
    times: dict[str, float] = {}
    counts: dict[str, int] = {}
    for avg in prof.key_averages():
        own = _self_device_us(avg) if cuda else avg.self_cpu_time_total
        if own > 0 and (not cuda or _on_device(avg)):
            times[avg.key] = own / 1e6
            counts[avg.key] = avg.count
    return summarize(times, counts, {}, steps=steps, wall_s=wall, source="cuda kernels" if cuda else "cpu ops")


def _self_device_us(avg) -> float:
    return float(getattr(avg, "self_device_time_total", getattr(avg, "self_cuda_time_total", 0.0)))


def _on_device(avg) -> bool:
    return "CUDA" in str(getattr(avg, "device_type", ""))
