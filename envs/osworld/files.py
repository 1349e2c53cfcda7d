"""OSWorld's task files on the env host: a content-addressed cache with a sha256 manifest.

OSWorld's tasks fetch files on the host at setup (`download` steps: a URL and the path in
the VM it is uploaded to) and at evaluation (`cloud_file` getters: the expected file). The
VM reaches nothing here, and an episode must not depend on the web, so the files come from
a cache filled once on a networked machine:

    <cache>/manifest.json      {"version": 1, "files": {URL: {"sha256": HEX, "size": N}}}
    <cache>/sha256/<HEX>       the bytes

`fill` downloads what is missing (http and https only, each file up to `MAX_FILE_BYTES`),
stores it under its hash and rewrites the manifest (atomically: a crash leaves the old one);
`read` serves a URL's bytes after checking them against the manifest's hash. Everything in
the manifest and the task JSONs is checked before use; refusals are `FileCacheError`s.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable, Iterable

from envs.types import TaskError

MANIFEST = "manifest.json"
MAX_FILE_BYTES = 1 << 30
MAX_MANIFEST_BYTES = 64 << 20
MAX_URL_CHARS = 4096
_HEX = re.compile(r"[0-9a-f]{64}")
_CHUNK = 1 << 20


class FileCacheError(TaskError):
    """A task file that cannot be served: not cached, corrupt, or a malformed entry."""


@dataclasses.dataclass(frozen=True)
class Entry:
    sha256: str
    size: int


def task_urls(example: dict) -> list[str]:
    """The URLs an OSWorld example fetches on the host: its `download` steps' files (setup
    and postconfig) and its `cloud_file` getters' paths, in order, without repeats."""
    evaluator = example.get("evaluator") or {}
    urls: list[str] = []
    for step in list(example.get("config") or []) + list(evaluator.get("postconfig") or []):
        if isinstance(step, dict) and step.get("type") == "download":
            files = (step.get("parameters") or {}).get("files")
            if not isinstance(files, list) or not all(isinstance(f, dict) for f in files):
                raise FileCacheError(f"OSWorld task {example.get('id')}: a download step's files must be "
                                     "a list of objects")
            urls += [f.get("url") for f in files]
    for role in ("result", "expected"):
        getters = evaluator.get(role)
        for getter in getters if isinstance(getters, list) else [getters]:
            if isinstance(getter, dict) and getter.get("type") == "cloud_file":
                path = getter.get("path")
                urls += path if getter.get("multi") and isinstance(path, list) else [path]
    for url in urls:
        check_url(url, example.get("id"))
    return list(dict.fromkeys(urls))


def check_url(url: object, task_id: object = None) -> str:
    if not isinstance(url, str) or not url.startswith(("https://", "http://")) or len(url) > MAX_URL_CHARS \
            or any(c in url for c in "\r\n\0"):
        raise FileCacheError(f"OSWorld task {task_id}: {str(url)[:200]!r} is not an http(s) URL of at most "
                             f"{MAX_URL_CHARS} characters")
    return url


class FileCache:
    """The cache folder `root` (its manifest is read once, at open)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.entries = self._load()

    def _load(self) -> dict[str, Entry]:
        path = self.root / MANIFEST
        if not path.exists():
            return {}
        if path.stat().st_size > MAX_MANIFEST_BYTES:
            raise FileCacheError(f"file cache manifest {path} is over {MAX_MANIFEST_BYTES} bytes")
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise FileCacheError(f"file cache manifest {path} is unreadable: {e}") from None
        files = data.get("files") if isinstance(data, dict) and data.get("version") == 1 else None
        if not isinstance(files, dict):
            raise FileCacheError(f"file cache manifest {path}: expected {{\"version\": 1, \"files\": {{...}}}}")
        entries = {}
        for url, entry in files.items():
            check_url(url, "in the manifest")
            if not (isinstance(entry, dict) and isinstance(entry.get("sha256"), str) and _HEX.fullmatch(entry["sha256"])
                    and type(entry.get("size")) is int and 0 <= entry["size"] <= MAX_FILE_BYTES):
                raise FileCacheError(f"file cache manifest {path}: bad entry for {url[:200]!r}")
            entries[url] = Entry(entry["sha256"], entry["size"])
        return entries

    def missing(self, urls: Iterable[str]) -> list[str]:
        return [u for u in urls if u not in self.entries or not self._blob(self.entries[u]).is_file()]

    def read(self, url: str) -> bytes:
        """The bytes cached for `url`, checked against the manifest's size and sha256."""
        entry = self.entries.get(url)
        blob = self._blob(entry) if entry else None
        if blob is None or not blob.is_file():
            raise FileCacheError(f"{url[:200]} is not in the file cache {self.root}")
        if blob.stat().st_size != entry.size:
            raise FileCacheError(f"file cache {self.root}: {url[:200]} has {blob.stat().st_size} bytes, "
                                 f"the manifest says {entry.size} (refill it)")
        data = blob.read_bytes()
        if hashlib.sha256(data).hexdigest() != entry.sha256:
            raise FileCacheError(f"file cache {self.root}: {url[:200]} does not match its sha256 (refill it)")
        return data

    def fill(self, urls: Iterable[str], fetch: Callable[[str, Path], None] | None = None) -> dict[str, str]:
        """Download every URL not cached yet; {url: error} for those that failed. The
        manifest is rewritten once at the end with what arrived."""
        fetch = fetch or download
        (self.root / "sha256").mkdir(parents=True, exist_ok=True)
        failed = {}
        for url in self.missing(urls):
            check_url(url)
            with tempfile.NamedTemporaryFile(dir=self.root, prefix=".part-", delete=False) as part:
                tmp = Path(part.name)
            try:
                fetch(url, tmp)
                digest, size = _hash(tmp)
                os.replace(tmp, self.root / "sha256" / digest)
                self.entries[url] = Entry(digest, size)
            except (OSError, FileCacheError) as e:
                failed[url] = str(e)
            finally:
                tmp.unlink(missing_ok=True)
        self._write_manifest()
        return failed

    def _write_manifest(self) -> None:
        body = {"version": 1, "files": {u: dataclasses.asdict(e) for u, e in sorted(self.entries.items())}}
        tmp = self.root / f".{MANIFEST}.tmp"
        tmp.write_text(json.dumps(body, indent=1) + "\n")
        os.replace(tmp, self.root / MANIFEST)

    def _blob(self, entry: Entry) -> Path:
        return self.root / "sha256" / entry.sha256


def download(url: str, dest: Path, timeout_s: float = 120.0, limit: int = MAX_FILE_BYTES) -> None:
    """`url`'s body into `dest`, refused past `limit` bytes (redirects to http(s) only)."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers={"User-Agent": "dart-jax"}),
                                    timeout=timeout_s) as response, open(dest, "wb") as out:
            check_url(response.geturl())
            total = 0
            while chunk := response.read(_CHUNK):
                total += len(chunk)
                if total > limit:
                    raise FileCacheError(f"{url[:200]} is over {limit} bytes")
                out.write(chunk)
    except (urllib.error.URLError, TimeoutError) as e:
        raise FileCacheError(f"cannot download {url[:200]}: {e}") from None


def _hash(path: Path) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size
