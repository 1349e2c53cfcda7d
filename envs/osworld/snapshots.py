"""A snapshot per task after its setup: a task's later resets restore it instead of
running the setup again (a GRPO group is 8 rollouts of one task).

    snapshots = TaskSnapshots(vm, max_count=8, max_mib=4096, store=folder)
    name = snapshot_name(example, files, task_dir)   # None: the task has no setup
    if not snapshots.restore(name, episode_files):   # loadvm task-<id>-<key>
        vm.restore(); run the setup; snapshots.save(name, episode_files)

The first reset of a task on a VM runs its setup and saves the VM's memory and disk
(`savevm` into the VM's overlay); a setup that fails saves nothing. The name carries the
task's id (made safe for QEMU: letters, digits, `_ . -`) and a key that hashes what the
setup depends on: its steps, the sha256s of the cached files it downloads, the size and
time of the local files it uploads. An edited task is saved anew, never restored stale.

The snapshots live in one VM's overlay, a temporary qcow2 that QEMU writes and that goes
with the VM (killed, or replaced when it dies or hangs); the overlay's backing is the image
folder, named by the image's source key, so a snapshot never outlives the image it was
taken on. Bounded per VM: at most `max_count` task snapshots and `max_mib` MiB of saved
memory (QEMU's vm-state-size) together; the least recently used go first (`delvm`).

Files the setup leaves on the host (`execute`'s stdout / stderr, kept for `cache_file`)
are copied beside each snapshot and put back when it is restored.
"""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import re
import shutil
from pathlib import Path
from typing import Protocol

from dart_jax.wire import paths
from envs.osworld.files import FileCache

log = logging.getLogger(__name__)

PREFIX = "task-"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
_ID_CHARS = 64


class Machine(Protocol):
    """What TaskSnapshots needs of a VM (envs.osworld.qemu.QemuVM)."""

    def save(self, snapshot: str) -> None: ...
    def restore(self, snapshot: str) -> None: ...
    def delete(self, snapshot: str) -> None: ...
    def snapshots(self) -> dict[str, int]: ...


def snapshot_name(example: dict, files: FileCache | None, task_dir: str) -> str | None:
    """`task-<safe id>-<key>` for an example's setup, or None when it has no setup steps."""
    steps = list(example.get("config") or [])
    if not steps:
        return None
    depends: list[object] = [example["id"], steps]
    for step in steps:
        params = step.get("parameters") if isinstance(step, dict) else None
        listed = params.get("files") if isinstance(params, dict) else None
        for f in listed if isinstance(listed, list) else []:
            if not isinstance(f, dict):
                continue
            if step.get("type") == "download" and files is not None and f.get("url") in files.entries:
                depends.append(files.entries[f["url"]].sha256)
            elif step.get("type") == "upload_file":
                depends.append(_local_stat(f.get("local_path"), task_dir))
    key = hashlib.sha256(json.dumps(depends, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return f"{PREFIX}{_UNSAFE.sub('_', str(example['id']))[:_ID_CHARS]}-{key}"


def _local_stat(name: object, task_dir: str) -> list[int] | None:
    """(size, mtime) of an uploaded file inside task_dir; None where the setup will refuse it."""
    if not task_dir or not isinstance(name, str):
        return None
    try:
        local = paths.confine(name, Path(task_dir), paths.roots(Path(task_dir)), field="local_path")
    except paths.PathRefused:
        return None
    stat = local.stat() if local.is_file() else None
    return [stat.st_size, stat.st_mtime_ns] if stat else None


class TaskSnapshots:
    """One VM's task snapshots, least recently used first (see the module docstring)."""

    def __init__(self, vm: Machine, max_count: int, max_mib: int, store: Path):
        self.vm, self.max_count, self.max_bytes, self.store = vm, max_count, max_mib << 20, store
        self.sizes: collections.OrderedDict[str, int] = collections.OrderedDict()  # name -> saved memory

    def restore(self, name: str | None, files: Path) -> bool:
        """Load `name` and put its host files in `files`; False when it is not saved."""
        if name is None or name not in self.sizes:
            return False
        self.vm.restore(name)
        self.sizes.move_to_end(name)
        shutil.rmtree(files, ignore_errors=True)
        if (self.store / name).is_dir():
            shutil.copytree(self.store / name, files)
        return True

    def save(self, name: str | None, files: Path) -> None:
        """Save the VM now as `name`, with a copy of `files`; then evict down to the bounds."""
        if name is None or self.max_count == 0:
            return
        self.vm.save(name)
        self.sizes[name] = self.vm.snapshots()[name]
        self.sizes.move_to_end(name)
        shutil.rmtree(self.store / name, ignore_errors=True)
        if files.is_dir():
            shutil.copytree(files, self.store / name)
        self._evict()

    def _evict(self) -> None:
        while self.sizes and (len(self.sizes) > self.max_count or sum(self.sizes.values()) > self.max_bytes):
            name, size = self.sizes.popitem(last=False)
            self.vm.delete(name)
            shutil.rmtree(self.store / name, ignore_errors=True)
            log.info("task snapshot %s (%d MiB) evicted: over %d snapshots or %d MiB", name, size >> 20,
                     self.max_count, self.max_bytes >> 20)
