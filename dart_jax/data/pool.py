"""Experience pool import and trajectory export, in the trajectory file formats of
`dart_jax.wire.trajfiles` (a directory of *.traj files, or JSONL).

Import keeps successes of known tasks only and is idempotent by traj_id. Export creates
its file or directory and never deletes or overwrites anything already there.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import uuid
from pathlib import Path
from typing import Sequence

import msgspec

from dart_jax.data.ingest import validate
from dart_jax.data.store import Store
from dart_jax.wire.trajfiles import read_trajectories, write_trajectories


@dataclasses.dataclass
class ImportResult:
    imported: int = 0
    duplicates: int = 0
    skipped: int = 0  # not a success, or a task this run does not have


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
