"""Experience pool import and trajectory export.

Two file formats, both whole `wire.Trajectory` objects:
- a directory of `*.traj` files, each one msgpack trajectory (`wire.to_bytes`);
- JSONL, one JSON trajectory a line: screenshots as base64 strings and every array as
  `{"dtype", "shape", "data": base64}` (readable fields for SFT and analysis).
Import keeps successes of known tasks only and is idempotent by traj_id. Export creates
its file or directory and never deletes or overwrites anything already there.
"""

from __future__ import annotations

import base64
import dataclasses
import os
import shutil
import uuid
from pathlib import Path
from typing import Any, Iterator, Sequence

import msgspec
import numpy as np

from dart_jax.data.ingest import validate
from dart_jax.wire.paths import check_inside
from dart_jax.data.store import Store
from dart_jax.wire import codec, from_bytes, to_bytes
from dart_jax.wire.messages import Id, Trajectory


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


def read_trajectories(path: Path, allowed: Sequence[Path] | None = None) -> Iterator[Trajectory]:
    """Trajectories in a *.traj/*.jsonl file or a directory of them (sorted by name). With
    `allowed` (resolved roots), each file must resolve inside one: a symlink in a directory
    cannot lead out (PathRefused)."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"{path}: no such file or directory")
    files = sorted(p for p in path.iterdir() if p.suffix in (".traj", ".jsonl")) if path.is_dir() else [path]
    for f in files if allowed is not None else ():  # all checked before anything is read
        check_inside(f, allowed, str(f))
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
            (path / f"{_file_stem(t.traj_id)}.traj").write_bytes(to_bytes(t))
    else:
        raise ValueError(f"unknown trajectory format {fmt!r} (traj or jsonl)")


def _file_stem(traj_id: str) -> str:
    """The id as a file name, checked as the wire checks it: a store written before ids
    were checked may hold one that would name a path."""
    try:
        return msgspec.convert(traj_id, Id)
    except msgspec.ValidationError as e:
        raise ValueError(f"trajectory id {traj_id[:64]!r} cannot be a file name: {e}") from None


def import_pool(store: Store, path: Path, chunk: int = 64, allowed: Sequence[Path] | None = None) -> ImportResult:
    """Add the successful trajectories under `path` to the store and its experience pool
    (`allowed`: see `read_trajectories`)."""
    known = {t.task_id for t in store.tasks()}
    result, batch = ImportResult(), []
    for traj in read_trajectories(path, allowed):
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
    """Write the selected trajectories to the new file (jsonl) or directory (traj) `path`;
    returns how many. Written beside it under a temporary name, then moved into place only
    if nothing is there (FileExistsError otherwise), so nothing is ever overwritten and a
    reader never sees a partial export."""
    path = Path(path)
    if fmt not in ("traj", "jsonl"):
        raise ValueError(f"unknown trajectory format {fmt!r} (traj or jsonl)")
    if os.path.lexists(path):
        raise FileExistsError(f"{path} exists; export writes only new paths")
    ids = store.trajectory_ids(success_only=success_only, split=split)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.partial")
    try:
        if fmt == "traj":  # created up front so an empty selection exports too
            tmp.mkdir()
        else:
            tmp.touch(exist_ok=False)
        for i in range(0, len(ids), chunk):
            write_trajectories(tmp, store.load_trajectories(ids[i:i + chunk]), fmt)
        _publish(tmp, path)
    finally:
        _remove_own(tmp)
    return len(ids)


def _publish(tmp: Path, path: Path) -> None:
    """Move `tmp` to `path` unless something appeared there meanwhile. link() never replaces
    a name; rename() of a directory replaces at most an empty directory."""
    try:
        if tmp.is_dir():
            os.rename(tmp, path)
        else:
            os.link(tmp, path)
    except OSError:
        if os.path.lexists(path):
            raise FileExistsError(f"{path} appeared during the export; left as it was") from None
        raise


def _remove_own(tmp: Path) -> None:
    """Remove the export's own temporary (gone already when published as a directory)."""
    if tmp.is_dir() and not tmp.is_symlink():
        shutil.rmtree(tmp)
    elif os.path.lexists(tmp):
        tmp.unlink()
