"""Trajectory files: whole `wire.Trajectory` objects in two formats.

- a directory of `*.traj` files, each one msgpack trajectory (`wire.to_bytes`);
- JSONL, one JSON trajectory a line: screenshots as base64 strings and every array as
  `{"dtype", "shape", "data": base64}` (readable fields for SFT and analysis).

The data manager imports and exports them (its experience pool), the trainer reads them
for SFT, `dart-jax run` writes demonstrations.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any, Iterator, Sequence

import msgspec
import numpy as np

from dart_jax.wire import codec, from_bytes, to_bytes
from dart_jax.wire.messages import Id, Trajectory
from dart_jax.wire.paths import check_inside


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
