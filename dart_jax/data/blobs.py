"""Content-addressed screenshot storage: append-only pack files indexed by sha256.

A screenshot is appended to the current pack file (`blobs/pack-000001.pack`, ...) and
addressed by the sha256 of its bytes (`wire.png.address`); the index row `(sha256, pack,
offset, size, height, width)` is written in the same transaction as the trajectory that refers to it (see store.py).
Bytes are appended before that transaction commits, so every committed index row
resolves; a crash in between leaves unreferenced bytes at a pack's tail, never a
dangling reference, and a restarted process opens a new pack rather than appending
after them. Identical screenshots are stored once.

Why packs and not one file per blob: creating a file costs 0.2-2 ms on the development
VMs (600-1,000 creates/s, no faster with more threads), which capped ingestion of
10-screenshot trajectories near 80/s; an append costs tens of microseconds.
"""

from __future__ import annotations

import dataclasses
import os
import re
import threading
from pathlib import Path

_PACK = re.compile(r"pack-(\d{6})\.pack$")


@dataclasses.dataclass(frozen=True)
class BlobRef:
    sha256: str
    pack: int
    offset: int
    size: int
    # the screenshot's size as the image processor sees it (wire.png); None in rows stored
    # before schema 3 recorded it
    height: int | None
    width: int | None


class BlobPacks:
    """The pack files of one blob directory: append, read, sync."""

    def __init__(self, root: Path, fsync: bool = False, pack_bytes: int = 1 << 30):
        self.root, self.fsync, self.pack_bytes = Path(root), fsync, pack_bytes
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._readers: dict[int, int] = {}
        self._fd: int | None = None
        self._pack = max(self.packs(), default=0)  # the next append opens a new pack
        self._size = 0

    def path(self, pack: int) -> Path:
        return self.root / f"pack-{pack:06d}.pack"

    def packs(self) -> list[int]:
        return sorted(int(m.group(1)) for p in self.root.iterdir() if (m := _PACK.match(p.name)))

    def append(self, data: bytes) -> tuple[int, int]:
        """Write `data` at the end of the current pack; returns (pack, offset)."""
        with self._lock:
            if self._fd is None or self._size + len(data) > self.pack_bytes:
                self._rotate()
            offset = self._size
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view):]
            self._size += len(data)
            return self._pack, offset

    def _rotate(self) -> None:
        if self._fd is not None:
            if self.fsync:
                os.fsync(self._fd)
            os.close(self._fd)
        self._pack += 1
        self._fd = os.open(self.path(self._pack), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        self._size = 0
        if self.fsync:
            _fsync_dir(self.root)

    def sync(self) -> None:
        """Make appended bytes durable against power loss (process death needs nothing)."""
        if self.fsync:
            with self._lock:
                fd = self._fd
            if fd is not None:
                os.fsync(fd)

    def read(self, pack: int, offset: int, size: int) -> bytes:
        fd = self._readers.get(pack)
        if fd is None:
            with self._lock:
                fd = self._readers.get(pack)
                if fd is None:
                    fd = self._readers[pack] = os.open(self.path(pack), os.O_RDONLY)
        data = os.pread(fd, size, offset)
        if len(data) != size:
            raise OSError(f"{self.path(pack)}: {size} bytes at {offset} are past its end")
        return data

    def sizes(self) -> dict[int, int]:
        return {p: self.path(p).stat().st_size for p in self.packs()}

    def close(self) -> None:
        with self._lock:
            for fd in [*self._readers.values(), *([self._fd] if self._fd is not None else [])]:
                os.close(fd)
            self._readers.clear()
            self._fd = None


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
