"""Shared-memory regions: weight buckets between a trainer host and a worker on one machine.

A trainer host with `weights.share_memory` keeps the bytes it serves in regions, files
under /dev/shm (one per served version slot, reused when its version leaves the window),
each bucket's pieces side by side. Asked with `WeightPull(shared=True)`, it answers
`WeightBucketShared`: the region, its token and where the bucket lies in it, instead of the
bytes. The worker maps the region read-only once (the mapping is kept across versions),
copies the bucket out and checks the bucket's checksum on its copy, so what it loads is
exactly what was checked even if a later version overwrites the region meanwhile (the
checksum then fails, and the pull with it, as a retired version's pull fails).

Whatever a reply names is hostile: the path must have a region's form
(`/dev/shm/dart-jax-<pid>-<16 hex>/slot-<n>`), is opened without following links, must be
a regular file whose header holds the reply's token (so a path that happens to exist here,
or another machine's region, is refused), and the bucket must lie inside it. A worker that
cannot use a host's regions (another machine, another /dev/shm) asks that host for bytes.

A trainer removes its directory when it closes; one that died leaves it, and the next
trainer on the machine removes the directories of processes that no longer run.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import re
import secrets
import shutil
import stat
from pathlib import Path

import numpy as np

from dart_jax.wire.messages import REGION_DIR

log = logging.getLogger(__name__)
SHM_ROOT = Path("/dev/shm")
MAGIC = b"DARTJAXW"
HEADER_BYTES = 64  # magic (8), token (16), data size (8), zero padding: the data starts 64-byte aligned
_DIR = re.compile(REGION_DIR)
_PATH = re.compile(rf"/dev/shm/{REGION_DIR}/slot-\d{{1,6}}")
_TOKEN = re.compile(r"[0-9a-f]{32}")


class RegionError(Exception):
    """A region that cannot be used here: not a region, not this machine's, or not the one named."""


class Region:
    """One mapped region: `data` is its bytes after the header (writable only for its creator)."""

    def __init__(self, path: str, token: str, mapping: mmap.mmap, size: int, writable: bool, fd: int = -1):
        self.path, self.token, self.size = path, token, size
        self._mapping, self._fd = mapping, fd
        self.data = np.frombuffer(mapping, np.uint8, count=size, offset=HEADER_BYTES)
        if not writable:
            self.data.flags.writeable = False

    @classmethod
    def create(cls, path: Path, size: int) -> "Region":
        """A new region file of `size` data bytes, with a fresh token in its header. Its memory
        is reserved now: a /dev/shm too small for it (a container's 64 MiB default) raises
        RegionError here, where writing into an unreserved mapping would kill the process."""
        token = secrets.token_bytes(16)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.posix_fallocate(fd, 0, HEADER_BYTES + size)
            mapping = mmap.mmap(fd, HEADER_BYTES + size)
        except OSError as e:
            os.unlink(path)
            raise RegionError(f"{path}: {size} bytes cannot be reserved in {path.parent.parent}: {e.strerror}") from None
        finally:
            os.close(fd)
        mapping[:HEADER_BYTES] = (MAGIC + token + size.to_bytes(8, "little")).ljust(HEADER_BYTES, b"\0")
        return cls(str(path), token.hex(), mapping, size, writable=True)

    @classmethod
    def open(cls, path: str, token: str) -> "Region":
        """Map the region `path` read-only, once it is shown to be the one `token` names."""
        if not _PATH.fullmatch(path) or not _TOKEN.fullmatch(token):
            raise RegionError(f"{path!r}: not a weight region (or a malformed token)")
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as e:
            raise RegionError(f"{path}: {e.strerror} (another machine's region?)") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size < HEADER_BYTES:
                raise RegionError(f"{path}: not a region file")
            head = os.pread(fd, HEADER_BYTES, 0)
            size = int.from_bytes(head[24:32], "little")
            if head[:8] != MAGIC or head[8:24].hex() != token or HEADER_BYTES + size != st.st_size:
                raise RegionError(f"{path}: not the region the reply names (its token or size differ)")
            mapping = mmap.mmap(fd, HEADER_BYTES + size, prot=mmap.PROT_READ)
        except BaseException:
            os.close(fd)
            raise
        return cls(path, token, mapping, size, writable=False, fd=fd)

    def unlinked(self) -> bool:
        """Whether its file is gone (its trainer closed or died, or the slot was replaced): a
        mapping kept then holds the memory of a region nobody serves."""
        return self._fd >= 0 and os.fstat(self._fd).st_nlink == 0

    def close(self) -> None:
        self.data = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        with contextlib.suppress(BufferError):  # a view still held elsewhere: the mapping goes with it
            self._mapping.close()


class RegionDir:
    """A trainer host's regions: `/dev/shm/dart-jax-<pid>-<random>/slot-<n>`, one per served
    version slot, replaced only when the bytes a slot must hold change (a new layout)."""

    def __init__(self, root: Path = SHM_ROOT):
        sweep(root)
        self.path = root / f"dart-jax-{os.getpid()}-{secrets.token_hex(8)}"
        self.path.mkdir(mode=0o700)
        self._slots: dict[int, Region] = {}

    def slot(self, index: int, size: int) -> Region:
        region = self._slots.get(index)
        if region is not None and region.size == size:
            return region
        if region is not None:  # workers still holding the old mapping keep it until they drop it
            region.close()
            os.unlink(region.path)
        region = self._slots[index] = Region.create(self.path / f"slot-{index}", size)
        return region

    def close(self) -> None:
        for region in self._slots.values():
            region.close()
        self._slots.clear()
        shutil.rmtree(self.path, ignore_errors=True)


def sweep(root: Path = SHM_ROOT) -> list[Path]:
    """Remove the region directories under `root` of this user's processes that no longer
    run (a trainer that died); returns them."""
    removed = []
    with contextlib.suppress(OSError):
        for entry in root.iterdir():
            m = _DIR.fullmatch(entry.name)
            if m is None or entry.is_symlink() or not entry.is_dir() or entry.stat().st_uid != os.getuid():
                continue
            if not _running(int(m.group(1))):
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(entry)
    if removed:
        log.info("removed %d weight region directories of processes that no longer run", len(removed))
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def available(root: Path = SHM_ROOT) -> bool:
    """Whether this machine has a shared-memory file system at `root` (Linux)."""
    return root.is_dir() and os.access(root, os.W_OK | os.X_OK)
