"""What XLA's memory plan of a compiled program holds: its largest buffers, read from XLA's
own buffer assignment (dumped while compiling), so that a case which does not fit the device
says what does not fit, from the same run.

    with memory_plan.dumping() as dump:   # before the process's first JAX computation
        exe = jitted.lower(*args).compile()
        print(json.dumps({"memory_plan": memory_plan.largest(dump)}))

XLA writes one buffer-assignment file per compiled module; the module with the largest
temporary allocation is the program in question (a train step beside its small helpers).
Values in the temporary allocation are the arrays XLA placed there; two may share bytes at
different times, so they are the largest things the plan holds, not a sum.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax

TOP = 12
_ALLOCATION = re.compile(r"^allocation (\d+): size (\d+), (.*):$")
_VALUE = re.compile(r"^\s*value: <\d+ (\S+) @\d+> \(size=(\d+),offset=\d+\): (.*)$")


@contextlib.contextmanager
def dumping() -> Iterator[Path]:
    """XLA dumps every module this process compiles from here on into a temporary directory,
    removed at the end. XLA reads its flags when the backend starts: enter before that.
    JAX's persistent compilation cache is off meanwhile: its key ignores the dump flags, so a
    program found there would be loaded, not compiled, and leave no plan."""
    before = os.environ.get("XLA_FLAGS")
    cached = jax.config.jax_enable_compilation_cache
    with tempfile.TemporaryDirectory(prefix="xla_dump_") as path:
        os.environ["XLA_FLAGS"] = f"{before or ''} --xla_dump_to={path} --xla_dump_hlo_as_text".strip()
        jax.config.update("jax_enable_compilation_cache", False)
        try:
            yield Path(path)
        finally:
            jax.config.update("jax_enable_compilation_cache", cached)
            if before is None:
                os.environ.pop("XLA_FLAGS", None)
            else:
                os.environ["XLA_FLAGS"] = before


def parse(text: str) -> dict:
    """One buffer-assignment file: bytes by kind of allocation, and every value in the
    temporary and parameter allocations as (name, shape, bytes)."""
    kinds = {"temp": 0, "parameter": 0, "other": 0}
    values: dict[str, list[dict]] = {"temp": [], "parameter": []}
    current = None
    for line in text.splitlines():
        if m := _ALLOCATION.match(line):
            current = _kind(m.group(3))
            kinds[current] += int(m.group(2))
        elif current in values and (v := _VALUE.match(line)):
            values[current].append({"name": v.group(1), "shape": v.group(3).strip(), "bytes": int(v.group(2))})
        elif not line.startswith(" "):
            current = None
    return {"temp_bytes": kinds["temp"], "parameter_bytes": kinds["parameter"], "other_bytes": kinds["other"],
            "largest_temps": sorted(values["temp"], key=lambda v: -v["bytes"])[:TOP],
            "largest_parameters": sorted(values["parameter"], key=lambda v: -v["bytes"])[:TOP // 2]}


def _kind(label: str) -> str:
    """An allocation's kind from its label: an entry parameter, a constant or thread-local
    buffer ("other"), or working memory (XLA's combined "preallocated-temp", an output)."""
    if "parameter" in label:
        return "parameter"
    return "other" if "constant" in label or "thread-local" in label else "temp"


def largest(dump: Path) -> dict | None:
    """The plan of the module with the largest temporary allocation in `dump`, or None where
    XLA wrote none (a backend that writes no buffer assignment)."""
    plans = [{"module": f.name.split("-buffer-assignment")[0], **parse(f.read_text(errors="replace"))}
             for f in dump.glob("*buffer-assignment.txt")]
    return max(plans, key=lambda p: p["temp_bytes"], default=None)


def run_dumping(run: Callable[[Any, Path | None], dict], case: Any, wanted: bool) -> dict:
    """`run(case, dump)` in a worker process, XLA dumping into `dump` where `wanted` (else
    `dump` is None)."""
    with dumping() if wanted else contextlib.nullcontext() as dump:
        return run(case, dump)


def figures(dump: Path | None) -> dict:
    """{"memory_plan": ...} for a worker's JSON line where it dumped, else nothing."""
    return {} if dump is None else {"memory_plan": largest(dump)}
