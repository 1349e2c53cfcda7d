"""The GPU suite's four parts (gpu_suite.py): the cases each runs, on a device and dry, and its targets.

Each part is a function `(dry, deadline, write, only) -> document`. It runs in a process of
its own, calls `write(document)` whenever a case finishes (so a part stopped at its limit
keeps what it measured), gives each case the time left before `deadline` (a
time.perf_counter() value) up to its own cap, and runs its cases in priority order (those the
issue's targets name first), or only those labelled in `only` (`<part>_cases` lists the
labels). Targets are {name: {value, target, met}}; `met` is None where nothing was measured.
The figures themselves come from the benchmarks named in each part.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

from benchmarks.gpu import publish_convert, vision_tower
from benchmarks.gpu.train_step import FORMULA, measure_row

Write = Callable[[dict], None]
Only = frozenset[str] | None
GiB = 2**30
CARD_BYTES = 80 * GiB  # "fits on 80 GB": an H100's memory


def time_left(deadline: float, cap: float, least: float = 10.0) -> Callable[[], float | None]:
    """The timeout of each next case: at most `cap` seconds, None (skip it) under `least` left."""
    def timeout() -> float | None:
        left = deadline - time.perf_counter()
        return None if left < least else min(cap, left)
    return timeout


def chosen(cases: list, labels: list[str], only: Only) -> list:
    return [c for c, label in zip(cases, labels) if only is None or label in only]


def target(value: Any, goal: str, met: Callable[[Any], bool]) -> dict:
    """`value` is the figure, or a case's status where it has none: "out of memory" misses the
    target, any other (timed out, skipped, failed) or None leaves it unknown."""
    if isinstance(value, str):
        return {"value": value, "target": goal, "met": False if value == "out of memory" else None}
    return {"value": value, "target": goal, "met": None if value is None else bool(met(value))}


def figure(result: dict, key: str, scale: float = 1.0) -> Any:
    """A case's figure (divided by `scale`), or its status where it did not run to the end."""
    if result.get("status") != "ok":
        return result.get("status")
    value = result.get(key)
    return None if value is None else value / scale


# ---- the train step: benchmarks/gpu/train_step.py, ours and transformers + torch ---------

BOTH = ("jax", "torch")


@dataclasses.dataclass(frozen=True)
class TrainPlan:
    rows: tuple[tuple[str, int, tuple[str, ...]], ...]  # (size, tokens per row, frameworks), by priority
    target: tuple[str, int]  # the (size, length) of the MFU and speed-up targets
    fits: tuple[str, int]  # the (size, length) that must fit on 80 GB
    tokens_per_step: int  # rows = this / length, at least 1
    steps: int  # timed steps after the first
    case_cap_s: float
    dtype: str = "bfloat16"
    remat: str = "full"  # as the accelerator configs train (configs/tpu/*.yaml)


TRAIN = TrainPlan(rows=(("3B", 8192, BOTH), ("3B", 32768, ("jax",)), ("1.5B", 8192, BOTH), ("3B", 4096, BOTH),
                        ("1.5B", 4096, BOTH)),
                  target=("3B", 8192), fits=("3B", 32768), tokens_per_step=16384, steps=3, case_cap_s=120)
DRY_TRAIN = TrainPlan(rows=(("micro", 256, BOTH),), target=("micro", 256), fits=("micro", 256),
                      tokens_per_step=512, steps=2, case_cap_s=90)


def train_cases(dry: bool) -> list[str]:
    return [f"{size}:{length}" for size, length, _ in (DRY_TRAIN if dry else TRAIN).rows]


def train_part(dry: bool, deadline: float, write: Write, only: Only = None) -> dict:
    plan = DRY_TRAIN if dry else TRAIN
    doc = {"part": "train_step", "formula": FORMULA, "dtype": plan.dtype, "remat": plan.remat,
           "tokens_per_step": plan.tokens_per_step, "steps": plan.steps, "results": []}
    for size, length, frameworks in chosen(list(plan.rows), train_cases(dry), only):
        doc["results"].append(measure_row(size, length, plan.tokens_per_step, frameworks, steps=plan.steps,
                                          dtype=plan.dtype, remat=plan.remat,
                                          timeout=time_left(deadline, plan.case_cap_s),
                                          profile=(size, length) == plan.target,
                                          memory=(size, length) == plan.fits))
        write(doc)
    return {**doc, "targets": train_targets(plan, doc["results"])}


def _row(results: list[dict], size: str, length: int) -> dict:
    return next((r for r in results if (r["size"], r["length"]) == (size, length)), {})


def train_targets(plan: TrainPlan, results: list[dict]) -> dict:
    at = lambda size, length: f"{size} at {length} tokens"  # noqa: E731
    row = _row(results, *plan.target)
    fit = _row(results, *plan.fits).get("jax", {})
    return {
        f"MFU, {at(*plan.target)}": target(figure(row.get("jax", {}), "mfu"), ">= 0.45", lambda v: v >= 0.45),
        f"tokens/s over transformers + torch, {at(*plan.target)}": target(row.get("speedup_vs_torch"), ">= 1.5",
                                                                          lambda v: v >= 1.5),
        f"peak GiB, {at(*plan.fits)} (fits on 80 GB)": target(figure(fit, "peak_bytes", GiB), "<= 80",
                                                              lambda v: v * GiB <= CARD_BYTES),
    }


# ---- the vision tower: benchmarks/gpu/vision_tower.py --------------------------------------

VISION_CAP_S = {False: 75, True: 120}  # per case: on a device, dry
SCREENSHOTS = (5, 1)  # the target's case first


def vision_cases(dry: bool) -> list[str]:
    return [str(n) for n in SCREENSHOTS]


def vision_part(dry: bool, deadline: float, write: Write, only: Only = None) -> dict:
    todo = [dataclasses.replace(c, memory=c.screenshots == 5)  # the target's case: what its plan holds
            for c in chosen(vision_tower.cases(dry, screenshots=SCREENSHOTS), vision_cases(dry), only)]
    doc = {"part": "vision_tower", "tower": dataclasses.asdict(vision_tower.TOWERS[todo[0].tower]),
           "dtype": todo[0].dtype, "remat": todo[0].remat, "attention": todo[0].attention, "results": []}
    for case in todo:
        doc["results"] += vision_tower.measure([case], time_left(deadline, VISION_CAP_S[dry]))
        write(doc)
    five = next((r for r in doc["results"] if r["screenshots"] == 5), {"status": None})
    return {**doc, "targets": {"peak GiB, 5 screenshots": target(figure(five, "peak_bytes", GiB), "< 40",
                                                                 lambda v: v < 40)}}


# ---- the log-prob kernel: benchmarks/gpu/loss_kernel.py ------------------------------------

KERNEL_SHAPES = {"0.5B": (896, 151_936), "7B": (3584, 152_064)}  # (hidden, vocab)
KERNEL_TOKENS = (4096, 16384)
DRY_KERNEL_SHAPES = {"0.5B": (32, 10_000), "7B": (48, 10_000)}  # two vocab chunks on CPU
DRY_KERNEL_TOKENS = (256, 512)


def _kernel_grid(dry: bool) -> list[tuple[str, int]]:
    shapes, tokens = (DRY_KERNEL_SHAPES, DRY_KERNEL_TOKENS) if dry else (KERNEL_SHAPES, KERNEL_TOKENS)
    return [(model, n) for n in tokens for model in shapes]


def kernel_cases(dry: bool) -> list[str]:
    return [f"{model}:{n}" for model, n in _kernel_grid(dry)]


def kernel_part(dry: bool, deadline: float, write: Write, only: Only = None) -> dict:
    import jax  # this part measures in its own process; the suite's driver imports this module

    from benchmarks.gpu.loss_kernel import compare
    from dart_jax.train.kernels import auto_chunks

    shapes = DRY_KERNEL_SHAPES if dry else KERNEL_SHAPES
    backend = jax.default_backend()
    doc = {"part": "loss_kernel", "device": jax.devices()[0].device_kind, "backend": backend, "dtype": "bfloat16",
           "loss": "sum(a * logp) + sum(b * entropy), gradients to hidden and LM head", "results": []}
    for model, n in chosen(_kernel_grid(dry), kernel_cases(dry), only):
        if time.perf_counter() > deadline - 5:
            doc["results"].append({"model": model, "tokens": n, "status": "skipped: out of time"})
            continue
        hidden, vocab = shapes[model]
        ct, cv = auto_chunks(backend, n, vocab)  # what the trainer takes on this backend
        doc["results"].append({"model": model, **compare(n, hidden, vocab, "bfloat16", chunk_tokens=ct,
                                                         chunk_vocab=cv, reps=2 if dry else 5)})
        write(doc)
    ratios = [r["fused_over_naive_s"] for r in doc["results"] if "fused_over_naive_s" in r]
    worst = max(ratios) if ratios else None
    if worst is not None:  # the chunks that would do better, while the part has time
        case = next(r for r in doc["results"] if r.get("fused_over_naive_s") == worst)
        doc["chunk_sweep"] = chunk_sweep(case, deadline, reps=2 if dry else 5)
        write(doc)
    return {**doc, "targets": {"fused time over naive, worst case": target(worst, "<= 1.0", lambda v: v <= 1.0)}}


def chunk_candidates(chunk_tokens: int, chunk_vocab: int, tokens: int, vocab: int) -> list[tuple[int, int]]:
    """The backend's chunks halved and doubled on each axis, within the problem (vocab chunks
    in multiples of 128 where the vocab allows), each once."""
    def clip(ct: int, cv: int) -> tuple[int, int]:
        cv = min(vocab, max(128, cv // 128 * 128)) if vocab >= 128 else vocab
        return min(tokens, max(1, ct)), cv
    pairs = [(2 * chunk_tokens, chunk_vocab), (chunk_tokens // 2, chunk_vocab), (chunk_tokens, 2 * chunk_vocab),
             (chunk_tokens, chunk_vocab // 2)]
    seen = {(chunk_tokens, chunk_vocab)}
    return [p for p in (clip(*q) for q in pairs) if not (p in seen or seen.add(p))]


def chunk_sweep(case: dict, deadline: float, reps: int, least_s: float = 10.0) -> dict:
    """The fused kernel at the worst case's shape with other chunks, against that case's naive
    time, each while `least_s` of the part's time is left: the fix where the kernel misses."""
    from benchmarks.gpu.loss_kernel import fused_time

    shape = (case["tokens"], case["hidden"], case["vocab"], case["dtype"])
    tried = []
    for ct, cv in chunk_candidates(case["chunk_tokens"], case["chunk_vocab"], case["tokens"], case["vocab"]):
        if time.perf_counter() > deadline - least_s:
            break
        run = fused_time(*shape, chunk_tokens=ct, chunk_vocab=cv, reps=reps)
        if run["status"] == "ok":
            run["fused_over_naive_s"] = run["fused_s"] / case["naive_s"]
        tried.append(run)
    timed = [r for r in tried if r["status"] == "ok"]
    best = min(timed, key=lambda r: r["fused_s"], default=None)
    return {"case": f"{case['model']} x {case['tokens']}", "backend_chunks": [case["chunk_tokens"], case["chunk_vocab"]],
            "backend_fused_over_naive_s": case["fused_over_naive_s"], "tried": tried,
            "best": None if best is None else {k: best[k] for k in ("chunk_tokens", "chunk_vocab", "fused_over_naive_s")}}


# ---- the publish conversion: benchmarks/gpu/publish_convert.py -----------------------------

def publish_cases(dry: bool) -> list[str]:
    return []  # one measurement


def publish_part(dry: bool, deadline: float, write: Write, only: Only = None) -> dict:
    # dry: small buckets, so that the micro policy's tensors still fill several
    doc = publish_convert.measure(2, 2, (64 << 10) if dry else publish_convert.BUCKET_MB << 20, dry,
                                  lambda d: write({"part": "publish", **d}))
    return {"part": "publish", **doc, "targets": {}}
