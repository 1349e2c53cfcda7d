"""GPU figures in one prepared command: the train step, the vision tower, the log-prob kernel
and the publish conversion at real sizes, each part in its own process under its own limit.

    python -m benchmarks.gpu.gpu_suite OUT_DIR             # a GPU host: at most 7.75 minutes (limits below)
    python -m benchmarks.gpu.gpu_suite OUT_DIR --dry       # every part at tiny sizes on CPU (a test runs this)
    python -m benchmarks.gpu.gpu_suite OUT_DIR --parts train_step --limit train_step=400   # a part again, longer
    python -m benchmarks.gpu.gpu_suite OUT_DIR --parts train_step --cases train_step=3B:4096,1.5B:4096

What each part measures and its cases are in gpu_parts.py; the figures come from the
benchmarks beside it: train_step, vision_tower, loss_kernel and publish_convert. OUT_DIR receives
`<part>.json` for each part (rewritten as its cases finish: a part stopped at its limit
keeps what it measured and says "timed_out"), `summary.json` (each part's status, wall
time, brief figures and targets, the card's name) and `suite.log` (every part's output):
six files, within what a device call brings back. One line per part is printed as it ends,
and the summary last, as one line of JSON.

This process starts no device backend (JAX would take 75% of a GPU's memory at its first
device query): parts and their workers each have the device to themselves in turn, JAX
workers with XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 so that a step that fits an 80 GB card
is not refused at 75%. `--dry` hides every accelerator (JAX_PLATFORMS=cpu, no CUDA devices).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from benchmarks.gpu import gpu_parts
from benchmarks.common import machine
from dart_jax.wire import process_groups

MARGIN_S = 5.0  # a part stops starting cases this long before its limit


@dataclasses.dataclass(frozen=True)
class Part:
    name: str
    limit_s: float  # on a device; the limits add up to 465 s, inside the 8 minutes
    dry_limit_s: float
    run: Callable[[bool, float, gpu_parts.Write, gpu_parts.Only], dict]
    cases: Callable[[bool], list[str]]  # the labels `--cases` may name


PARTS = (
    Part("train_step", 270, 200, gpu_parts.train_part, gpu_parts.train_cases),
    Part("vision_tower", 95, 200, gpu_parts.vision_part, gpu_parts.vision_cases),
    Part("loss_kernel", 45, 120, gpu_parts.kernel_part, gpu_parts.kernel_cases),
    Part("publish", 55, 120, gpu_parts.publish_part, gpu_parts.publish_cases),
)
BY_NAME = {p.name: p for p in PARTS}


def write_json(path: Path, doc: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    tmp.replace(path)


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def run_part(part: Part, out: Path, dry: bool, limit_s: float, only: gpu_parts.Only) -> None:
    """This process is the part: its document, rewritten as cases finish, then complete."""
    deadline = time.perf_counter() + limit_s - MARGIN_S
    path = out / f"{part.name}.json"
    doc = part.run(dry, deadline, lambda d: write_json(path, {**d, "status": "running"}), only)
    write_json(path, {**doc, "status": "ok"})


def child_env(dry: bool) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if dry:
        env |= {"JAX_PLATFORMS": "cpu", "CUDA_VISIBLE_DEVICES": ""}
    else:
        env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.95")
    return env


def _cpu_s() -> float:
    """CPU seconds of this process's finished children and theirs."""
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def launch(part: Part, out: Path, dry: bool, limit_s: float, only: gpu_parts.Only, log) -> tuple[str, float]:
    """The part in its own process group, killed with its workers at the limit, or when this
    process is stopped (the group stays in this session: whoever ends the session ends it
    too): (status, wall s)."""
    cmd = [sys.executable, "-m", "benchmarks.gpu.gpu_suite", str(out), "--part", part.name, "--part-limit", str(limit_s)]
    cmd += ["--cases", f"{part.name}={','.join(sorted(only))}"] if only else []
    start = time.perf_counter()
    proc = subprocess.Popen(cmd + (["--dry"] if dry else []), stdout=log, stderr=log, env=child_env(dry),
                            process_group=0)
    try:
        rc = proc.wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
        rc = None
    finally:  # the limit, or this process stopped (SIGTERM is turned into SystemExit in main)
        if proc.poll() is None:
            process_groups.kill(proc)
    (out / f"{part.name}.tmp").unlink(missing_ok=True)  # a write the kill cut short
    status = "timed_out" if rc is None else "ok" if rc == 0 else f"failed (exit {rc})"
    return status, time.perf_counter() - start


def card() -> str | None:
    """The GPU's name, memory and driver as nvidia-smi reports them (no CUDA context)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    name = out.stdout.strip()
    return name if out.returncode == 0 and name else None


def devices(doc) -> set[str]:
    """Every device name a part's workers reported."""
    if isinstance(doc, dict):
        found = {doc["device"]} if isinstance(doc.get("device"), str) else set()
        return found.union(*(devices(v) for v in doc.values()))
    if isinstance(doc, list):
        return set().union(*(devices(v) for v in doc))
    return set()


def _log_tail(path: Path, offset: int, chars: int = 600) -> str:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")[-chars:]


def run_suite(out: Path, parts: list[Part], dry: bool, limits: dict[str, float],
              only: dict[str, frozenset[str]]) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    log_path = out / "suite.log"
    start = time.perf_counter()
    summary = {"suite": "gpu_suite", "dry": dry, "card": card(), "machine": machine(),
               "load_avg_1min": [round(os.getloadavg()[0], 2)], "parts": {}}
    with open(log_path, "ab") as log:
        for part in parts:
            (out / f"{part.name}.json").unlink(missing_ok=True)  # no figures of an earlier run
            limit = limits.get(part.name, part.dry_limit_s if dry else part.limit_s)
            log.flush()
            offset, cpu = log_path.stat().st_size, _cpu_s()
            status, wall = launch(part, out, dry, limit, only.get(part.name), log)
            cpu = _cpu_s() - cpu
            doc = read_json(out / f"{part.name}.json")
            if doc is not None and status != "ok":
                doc["status"] = status
                write_json(out / f"{part.name}.json", doc)
            entry = {"status": status, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "limit_s": limit,
                     **brief(part.name, doc)}
            if status.startswith("failed"):
                entry["log_tail"] = _log_tail(log_path, offset)
            summary["parts"][part.name] = entry
            print(f"{part.name}: {status} in {wall:.0f} s (limit {limit:.0f} s)", flush=True)
    summary["devices"] = sorted(set().union(*(devices(read_json(out / f"{p.name}.json")) for p in parts)))
    summary["wall_s"] = round(time.perf_counter() - start, 1)
    summary["load_avg_1min"].append(round(os.getloadavg()[0], 2))  # at the start and the end
    write_json(out / "summary.json", summary)
    return summary


# ---- the summary's brief figures -------------------------------------------------------

def _r(x, digits: int = 3):
    return round(x, digits) if isinstance(x, float) else x


def _gib(x):
    return round(x / gpu_parts.GiB, 2) if isinstance(x, (int, float)) else None


def _largest(res: dict) -> dict:
    """The three largest buffers of XLA's plan where the case read it: what a miss is made of."""
    plan = res.get("memory_plan")
    return {} if not plan else {"largest_gib": [f"{v['shape']} {_gib(v['bytes'])}" for v in plan["largest_temps"][:3]]}


def _case(res: dict) -> dict:
    if res.get("status") != "ok":
        return {"status": res.get("status"), "plan_gib": _gib(res.get("plan_bytes")), **_largest(res)}
    start = "compile_s" if "compile_s" in res else "warmup_s"  # eager torch compiles nothing
    figures = {"tokens_per_s": _r(res.get("tokens_per_s"), 0), "mfu": _r(res.get("mfu")),
               "peak_gib": _gib(res.get("peak_bytes")), start: _r(res.get(start), 1),
               "step_s": _r(res.get("step_s")), **_largest(res)}
    if profile := res.get("profile"):  # where the step's time went: seconds a step by kind
        figures["profile"] = {"error": profile["error"]} if "error" in profile else {
            "busy_share": _r(profile["busy_share"]), **{k: _r(v, 4) for k, v in profile["by_kind_s"].items()}}
    return figures


def brief(name: str, doc: dict | None) -> dict:
    """The figures a reader looks for first, rounded; the part's file has them all."""
    if doc is None:
        return {}
    rows = doc.get("results", [])
    if name == "train_step":
        figures = [{"case": f"{r['size']} x {r['length']} ({r['rows']} rows)",
                    **{fw: _case(r[fw]) for fw in ("jax", "torch") if fw in r},
                    "speedup_vs_torch": _r(r.get("speedup_vs_torch"))} for r in rows]
    elif name == "vision_tower":
        figures = [{"screenshots": r["screenshots"], "slots": r.get("slots"), "status": r.get("status"),
                    "peak_gib": _gib(r.get("peak_bytes")), "plan_gib": _gib(r.get("plan_bytes")),
                    "step_s": _r(r.get("step_s")), "compile_s": _r(r.get("compile_s"), 1), **_largest(r)}
                   for r in rows]
    elif name == "loss_kernel":
        figures = [{"case": f"{r['model']} x {r['tokens']}", "chunks": [r.get("chunk_tokens"), r.get("chunk_vocab")],
                    **{k: _r(r.get(k), 4) for k in ("naive_s", "fused_s", "fused_over_naive_s")},
                    "naive_temp_gib": _gib(r.get("naive_temp_bytes")),
                    "fused_temp_gib": _gib(r.get("fused_temp_bytes")),
                    **{k: r[k] for k in ("status", "naive_status", "fused_status") if r.get(k, "ok") != "ok"}}
                   for r in rows]
    else:
        figures = {k: _r(doc.get(k)) for k in ("gb_per_s", "fp32_gb_per_s", "first_s", "s", "full_7b_s")}
        figures["out_gib"] = _gib(doc.get("out_bytes"))
    out = {"figures": figures, "targets": doc.get("targets", {})}
    if sweep := doc.get("chunk_sweep"):  # the kernel's worst case at other chunks: the best found
        out["chunk_sweep"] = {"case": sweep["case"], "backend_chunks": sweep["backend_chunks"], "best": sweep["best"]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path, help="where the JSON files and the log go")
    ap.add_argument("--dry", action="store_true", help="every part at tiny sizes, on CPU")
    ap.add_argument("--parts", default=",".join(BY_NAME), help=f"comma-separated, from {list(BY_NAME)}")
    ap.add_argument("--limit", action="append", default=[], metavar="PART=SECONDS", help="another limit for a part")
    ap.add_argument("--cases", action="append", default=[], metavar="PART=LABEL,...",
                    help="only these cases of a part (labels: " + "; ".join(
                        f"{p.name} {','.join(p.cases(False))}" for p in PARTS if p.cases(False)) + ")")
    ap.add_argument("--part", choices=sorted(BY_NAME), help=argparse.SUPPRESS)  # run one part in this process
    ap.add_argument("--part-limit", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped suite stops its part
    only = parse_cases(ap, args.cases, args.dry)
    if args.part:
        run_part(BY_NAME[args.part], args.out, args.dry, args.part_limit, only.get(args.part))
        return
    unknown = [p for p in args.parts.split(",") if p not in BY_NAME]
    if unknown:
        ap.error(f"unknown parts {unknown}; choose from {list(BY_NAME)}")
    limits = {}
    for item in args.limit:
        name, _, seconds = item.partition("=")
        if name not in BY_NAME or not seconds.replace(".", "", 1).isdigit():
            ap.error(f"--limit {item!r}: PART=SECONDS with PART from {list(BY_NAME)}")
        limits[name] = float(seconds)
    parts = [BY_NAME[p] for p in args.parts.split(",")]
    print(json.dumps(run_suite(args.out, parts, args.dry, limits, only)))


def parse_cases(ap: argparse.ArgumentParser, items: list[str], dry: bool) -> dict[str, frozenset[str]]:
    only = {}
    for item in items:
        name, _, labels = item.partition("=")
        known = BY_NAME[name].cases(dry) if name in BY_NAME else []
        chosen = frozenset(labels.split(","))
        if not known or not chosen <= set(known):
            ap.error(f"--cases {item!r}: PART=LABEL,... with labels of the part ({name}: {known})")
        only[name] = chosen
    return only


if __name__ == "__main__":
    main()
