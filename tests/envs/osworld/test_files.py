"""The task-file cache: filled from a real HTTP server on loopback, served only when the
bytes match the manifest's sha256; hostile manifests and task JSONs are refused."""

import functools
import hashlib
import json

import pytest

from envs.osworld import files
from envs.osworld.files import FileCache, FileCacheError, task_urls


def test_fill_downloads_verifies_and_serves(web, tmp_path):
    base, root, served = web
    (root / "a.xlsx").write_bytes(b"sheet" * 1000)
    (root / "b.png").write_bytes(b"\x89PNG-ish")
    cache = FileCache(tmp_path / "cache")
    urls = [f"{base}/a.xlsx", f"{base}/b.png", f"{base}/gone.txt"]
    failed = cache.fill(urls)
    assert list(failed) == [f"{base}/gone.txt"] and "404" in failed[f"{base}/gone.txt"]
    manifest = json.loads((tmp_path / "cache" / "manifest.json").read_text())
    digest = hashlib.sha256(b"sheet" * 1000).hexdigest()
    assert manifest["files"][f"{base}/a.xlsx"] == {"sha256": digest, "size": 5000}
    assert (tmp_path / "cache" / "sha256" / digest).read_bytes() == b"sheet" * 1000
    assert not list((tmp_path / "cache").glob(".part-*"))
    reopened = FileCache(tmp_path / "cache")
    assert reopened.read(f"{base}/b.png") == b"\x89PNG-ish"
    assert reopened.missing(urls) == [f"{base}/gone.txt"]
    before = len(served)
    assert reopened.fill(urls[:2]) == {} and len(served) == before  # nothing fetched twice
    with pytest.raises(FileCacheError, match="gone.txt is not in the file cache"):
        reopened.read(f"{base}/gone.txt")


def test_a_corrupt_or_truncated_file_is_refused(web, tmp_path):
    base, root, _ = web
    (root / "a.bin").write_bytes(b"0123456789")
    cache = FileCache(tmp_path / "cache")
    assert cache.fill([f"{base}/a.bin"]) == {}
    blob = tmp_path / "cache" / "sha256" / hashlib.sha256(b"0123456789").hexdigest()
    blob.write_bytes(b"0123456780")
    with pytest.raises(FileCacheError, match="does not match its sha256"):
        cache.read(f"{base}/a.bin")
    blob.write_bytes(b"01234")
    with pytest.raises(FileCacheError, match="has 5 bytes, the manifest says 10"):
        cache.read(f"{base}/a.bin")


def test_a_download_over_the_limit_leaves_nothing(web, tmp_path):
    base, root, _ = web
    (root / "big.bin").write_bytes(b"x" * 5000)
    cache = FileCache(tmp_path / "cache")
    failed = cache.fill([f"{base}/big.bin"], fetch=functools.partial(files.download, limit=4096))
    assert "over 4096 bytes" in failed[f"{base}/big.bin"]
    assert cache.missing([f"{base}/big.bin"]) == [f"{base}/big.bin"]
    assert list((tmp_path / "cache" / "sha256").iterdir()) == [] and not list((tmp_path / "cache").glob(".part-*"))


@pytest.mark.parametrize("manifest, why", [
    ("{oops", "unreadable"),
    (json.dumps({"version": 2, "files": {}}), "expected"),
    (json.dumps({"version": 1, "files": []}), "expected"),
    (json.dumps({"version": 1, "files": {"https://x/a": {"sha256": "../../etc/passwd", "size": 1}}}), "bad entry"),
    (json.dumps({"version": 1, "files": {"https://x/a": {"sha256": "0" * 64, "size": -1}}}), "bad entry"),
    (json.dumps({"version": 1, "files": {"https://x/a": {"sha256": "0" * 64, "size": True}}}), "bad entry"),
    (json.dumps({"version": 1, "files": {"file:///etc/passwd": {"sha256": "0" * 64, "size": 1}}}), "http"),
])
def test_hostile_manifests_are_refused(tmp_path, manifest, why):
    (tmp_path / "manifest.json").write_text(manifest)
    with pytest.raises(FileCacheError, match=why):
        FileCache(tmp_path)


def test_task_urls_reads_download_steps_and_cloud_files():
    example = {"id": "t", "config": [{"type": "download", "parameters": {"files": [
                   {"url": "https://h/a.xlsx", "path": "/home/user/a.xlsx"},
                   {"url": "https://h/b.docx", "path": "/home/user/b.docx"}]}},
               {"type": "launch", "parameters": {"command": ["x"]}}],
               "evaluator": {"func": ["compare_table", "compare_table"],
                             "postconfig": [{"type": "download", "parameters": {"files": [
                                 {"url": "https://h/a.xlsx", "path": "/tmp/a.xlsx"}]}}],
                             "result": [{"type": "vm_file", "path": "/x", "dest": "x"}],
                             "expected": [{"type": "cloud_file", "path": "https://h/gold.xlsx", "dest": "g.xlsx"},
                                          {"type": "cloud_file", "multi": True, "path": ["https://h/1", "https://h/2"],
                                           "dest": ["1", "2"], "gives": [1]}]}}
    assert task_urls(example) == ["https://h/a.xlsx", "https://h/b.docx", "https://h/gold.xlsx", "https://h/1",
                                  "https://h/2"]
    for bad in ("file:///etc/passwd", "/etc/passwd", 7, "https://h/\nx", "https://" + "a" * files.MAX_URL_CHARS):
        with pytest.raises(FileCacheError, match="http"):
            task_urls({"id": "t", "evaluator": {},
                       "config": [{"type": "download", "parameters": {"files": [{"url": bad, "path": "/p"}]}}]})
    with pytest.raises(FileCacheError, match="list of objects"):
        task_urls({"id": "t", "evaluator": {},
                   "config": [{"type": "download", "parameters": {"files": "https://h/a"}}]})
