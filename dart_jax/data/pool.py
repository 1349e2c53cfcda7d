"""Experience pool import and trajectory export.

Two file formats, both whole `wire.Trajectory` objects:
- a directory of `*.traj` files, each one msgpack trajectory (`wire.to_bytes`);
- JSONL, one JSON trajectory a line: screenshots as base64 strings and every array as
  `{"dtype", "shape", "data": base64}` (readable fields for SFT and analysis).
Import keeps successes of known tasks only and is idempotent by traj_id.
"""

from __future__ import annotations

import base64
import dataclasses
from pathlib import Path
from typing import Any, Iterator, Sequence

import msgspec
import numpy as np

from dart_jax.data.ingest import validate
from dart_jax.data.store import Store
from dart_jax.wire import codec, from_bytes, to_bytes
from dart_jax.wire.messages import Trajectory


@dataclasses.dataclass
class ImportResult:
    imported: int = 0
    duplicates: int = 0
    skipped: int = 0  # not a success, or a task this run does not have


def _json_enc(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        arr = np.ascontiguousarray(obj)
        return {"dtype": arr.dtype.str, "shape": list(arr.shape), "data": base64.b64encode(arr.tobytes()).decode()}
    raise TypeError(f"{type(obj).__name__} cannot be written as JSON")


def _json_dec(tp: type, obj: Any) -> Any:
    if isinstance(obj, dict) and isinstance(obj.get("data"), str):
        obj = {**obj, "data": base64.b64decode(obj["data"], validate=True)}
    return codec._dec_hook(tp, obj)  # same dtype whitelist and size checks as the wire


_json_encoder = msgspec.json.Encoder(enc_hook=_json_enc)


def read_trajectories(path: Path) -> Iterator[Trajectory]:
    """Trajectories in a *.traj/*.jsonl file or a directory of them (sorted by name)."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"{path}: no such file or directory")
    files = sorted(p for p in path.iterdir() if p.suffix in (".traj", ".jsonl")) if path.is_dir() else [path]
    for f in files:
        if f.suffix == ".traj":
            yield from_bytes(f.read_bytes(), Trajectory)
        elif f.suffix == ".jsonl":
            with open(f, "rb") as lines:
                for lineno, line in enumerate(lines, start=1):
                    if line.strip():
                        yield _decode_line(line, f, lineno)
        else:
            raise ValueError(f"{f}: expected a .traj or .jsonl file")


def _decode_line(line: bytes, f: Path, lineno: int) -> Trajectory:
    try:
        return msgspec.json.decode(line, type=Trajectory, dec_hook=_json_dec)
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as e:
        raise ValueError(f"{f}:{lineno}: not a trajectory: {e}") from None


def write_trajectories(path: Path, trajs: Sequence[Trajectory], fmt: str) -> None:
    """Append to a JSONL file (`fmt="jsonl"`) or write `<traj_id>.traj` files into a directory."""
    path = Path(path)
    if fmt == "jsonl":
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "ab") as f:
            for t in trajs:
                f.write(_json_encoder.encode(t) + b"\n")
    elif fmt == "traj":
        path.mkdir(parents=True, exist_ok=True)
        for t in trajs:
            (path / f"{t.traj_id}.traj").write_bytes(to_bytes(t))
    else:
        raise ValueError(f"unknown trajectory format {fmt!r} (traj or jsonl)")


def import_pool(store: Store, path: Path, chunk: int = 64) -> ImportResult:
    """Add the successful trajectories under `path` to the store and its experience pool."""
    known = {t.task_id for t in store.tasks()}
    result, batch = ImportResult(), []
    for traj in read_trajectories(path):
        if traj.status != "success" or traj.task_id not in known:
            result.skipped += 1
            continue
        validate(traj, known)
        if traj.source == "rollout":
            traj = msgspec.structs.replace(traj, source="pool")  # never mistaken for fresh data
        batch.append((traj, store.put_screenshots(traj)))
        if len(batch) >= chunk:
            _commit(store, batch, result)
            batch = []
    _commit(store, batch, result)
    return result


def _commit(store: Store, batch: list, result: ImportResult) -> None:
    store.blobs.sync()
    with store.write() as w:
        for traj, refs in batch:
            if store.insert_trajectory(w, traj, refs, pool_origin="import"):
                result.imported += 1
            else:
                result.duplicates += 1


def export(store: Store, path: Path, fmt: str, success_only: bool = False,
           split: str | None = None, chunk: int = 64) -> int:
    """Write the selected trajectories to `path`; returns how many."""
    ids = store.trajectory_ids(success_only=success_only, split=split)
    if fmt == "jsonl" and Path(path).exists():
        Path(path).unlink()
    for i in range(0, len(ids), chunk):
        write_trajectories(path, store.load_trajectories(ids[i:i + chunk]), fmt)
    return len(ids)
