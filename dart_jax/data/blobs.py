"""Content-addressed blob directory: `blobs/ab/abcdef...` named by the sha256 of the bytes.

Writes are atomic (a unique temporary file renamed into place), so a reader or a crash
sees a whole blob or none; identical screenshots are stored once. A blob is written
before the database row that refers to it commits, so every committed reference
resolves; a crash between the two leaves an unreferenced blob, which `orphans` lists.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path


class BlobStore:
    def __init__(self, root: Path, fsync: bool = False):
        self.root, self.fsync = Path(root), fsync
        self.root.mkdir(parents=True, exist_ok=True)
        self._tmp_ids = iter(range(1 << 62))
        self._lock = threading.Lock()

    @staticmethod
    def address(data: bytes) -> str:
        return hashlib.sha256(data).hexdigest()

    def path(self, digest: str) -> Path:
        return self.root / digest[:2] / digest

    def put(self, data: bytes) -> str:
        """Store `data` (a no-op when present); returns its sha256 hex digest."""
        digest = self.address(data)
        final = self.path(digest)
        if final.exists():
            return digest
        final.parent.mkdir(exist_ok=True)
        with self._lock:
            n = next(self._tmp_ids)
        tmp = final.parent / f".tmp-{os.getpid()}-{n}"
        with open(tmp, "wb") as f:
            f.write(data)
            if self.fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, final)
        if self.fsync:
            _fsync_dir(final.parent)
        return digest

    def get(self, digest: str) -> bytes:
        return self.path(digest).read_bytes()

    def verify(self, digest: str) -> bool:
        """The blob exists and its bytes still hash to its name."""
        try:
            return self.address(self.get(digest)) == digest
        except FileNotFoundError:
            return False

    def digests(self) -> set[str]:
        return {p.name for p in self.root.glob("??/*") if not p.name.startswith(".tmp-")}

    def remove_temporaries(self) -> int:
        """Delete temporaries a killed writer left behind (call only while none writes)."""
        stale = list(self.root.glob("??/.tmp-*"))
        for p in stale:
            p.unlink(missing_ok=True)
        return len(stale)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
