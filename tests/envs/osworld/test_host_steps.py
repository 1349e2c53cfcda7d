"""The setup steps and getters that run on the host: chrome_open_tabs / chrome_close_tabs
over DevTools against a real headless Chromium, cloud_file / cache_file / download from the
file cache, and their refusals."""

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time

import pytest

from dart_jax.wire import process_groups
from envs.config import OSWorldSlots
from envs.osworld import cdp, evaluation
from envs.osworld.evaluation import Runner
from envs.osworld.env import OSWorldEnv, VMClient
from envs.osworld.files import FileCache
from envs.osworld.sidecar import EvalSidecar
from envs.osworld.qemu import free_port
from envs.types import EnvError, Task, TaskError
from tests.envs.conftest import vm_slots


@pytest.fixture
def chromium(tmp_path):
    """Headless Chromium with DevTools on a free loopback port: its base URL."""
    port = free_port()
    profile = tempfile.mkdtemp(prefix="h4-cdp-", dir=tmp_path)
    proc = subprocess.Popen(["chromium", "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                             "--disable-dev-shm-usage", f"--remote-debugging-port={port}", f"--user-data-dir={profile}",
                             "about:blank"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        process_groups.kill(proc)


def _page(tmp_path, name):
    path = tmp_path / name
    path.write_text(f"<title>{name}</title>")
    return path.as_uri()


@pytest.mark.browser
def test_chrome_tabs_open_and_close_over_devtools(chromium, tmp_path):
    runner = Runner(None, (1280, 800), tmp_path / "cache", "", devtools_url=chromium)
    browser = cdp.DevTools(chromium)
    browser.wait(30)
    assert [t["url"] for t in browser.tabs()] == ["about:blank"]
    a, b = _page(tmp_path, "a.html"), _page(tmp_path, "b.html") + "#part"
    runner.setup([{"type": "chrome_open_tabs", "parameters": {"urls_to_open": [a, b]}}])
    assert sorted(t["url"] for t in browser.tabs()) == [a, b]  # the blank tab went after the first
    evaluator = {"func": "is_expected_tabs", "result": {"type": "open_tabs_info"},
                 "expected": {"type": "rule", "rules": {"type": "url", "urls": [b, a]}}}
    assert runner.evaluate(evaluator, None) == 1.0  # the open_tabs_info getter, OSWorld's metric
    runner.setup([{"type": "chrome_close_tabs", "parameters": {"urls_to_close": [a, "file:///nowhere.html"]}}])
    assert [t["url"] for t in browser.tabs()] == [b]
    [tab] = runner._get(evaluator["result"])
    assert tab["url"] == b and isinstance(tab["title"], str)  # the page's title once loaded, a stand-in before
    assert runner.evaluate(evaluator, None) == 0.0  # one tab of the two
    with pytest.raises(EnvError, match="no browser answered"):
        cdp.DevTools(f"http://127.0.0.1:{free_port()}", timeout_s=1).wait(1)
    with pytest.raises(TaskError, match="DevTools"):
        Runner(None, (1280, 800), tmp_path, "").setup([{"type": "chrome_open_tabs",
                                                         "parameters": {"urls_to_open": [a]}}])


def test_expected_tabs_as_osworld_checks_them():
    tabs = [{"title": "A", "url": "https://www.example.org/"}, {"title": "B", "url": "file:///home/user/b.html"}]
    rule = {"type": "url", "urls": ["file:///home/user/b.html", "https://example.org"]}
    assert evaluation.is_expected_tabs(tabs, rule) == 1.0
    assert evaluation.is_expected_tabs(tabs[:1], rule) == 0.0  # a tab missing
    assert evaluation.is_expected_tabs(tabs + tabs[:1], rule) == 0.0  # a tab too many
    assert evaluation.is_expected_tabs(tabs, {"type": "title", "urls": []}) == 0.0  # OSWorld knows url alone
    assert evaluation.is_expected_tabs(None, rule) == 0.0


def test_urls_compare_as_osworld_compares_them():
    assert cdp.same_url("https://WWW.Example.org/", "https://example.org")
    assert cdp.same_url("example.org/a", "http://example.org/a") is False  # no scheme: a path, as urlsplit reads it
    assert not cdp.same_url("https://example.org/a", "https://example.org/b")


@pytest.fixture
def cached(tmp_path):
    """A file cache holding two URLs (filled from local files, as `fill` stores them)."""
    bodies = {"https://files.example/gold.xlsx": b"gold", "https://files.example/input.bin": os.urandom(3000)}
    cache = FileCache(tmp_path / "files")
    assert cache.fill(bodies, fetch=lambda url, dest: dest.write_bytes(bodies[url])) == {}
    return FileCache(tmp_path / "files"), bodies


def test_cloud_file_and_cache_file_getters(cached, tmp_path, fake_vm):
    files, bodies = cached
    runner = Runner(VMClient(fake_vm.url, timeout_s=5), (1280, 800), tmp_path / "episode", "", files)
    single = runner._get({"type": "cloud_file", "path": "https://files.example/gold.xlsx", "dest": "gold.xlsx"})
    assert open(single, "rb").read() == b"gold"
    multi = runner._get({"type": "cloud_file", "multi": True, "gives": [0, 1], "dest": ["g", "i"],
                         "path": ["https://files.example/gold.xlsx", "https://files.example/input.bin"]})
    assert [open(p, "rb").read() for p in multi] == [b"gold", bodies["https://files.example/input.bin"]]
    runner.setup([{"type": "execute", "parameters": {"command": ["echo", "x"], "stdout": "echo.out"}}])
    assert runner._get({"type": "cache_file", "path": "echo.out"}) == str(tmp_path / "episode" / "echo.out")
    assert runner._get({"type": "cache_file", "path": "never.out"}) is None
    for getter in ({"type": "cloud_file", "path": "https://files.example/gold.xlsx", "dest": "../../x"},
                   {"type": "cache_file", "path": "/etc/passwd"}, {"type": "cache_file", "path": ".."}):
        with pytest.raises(TaskError, match="plain name"):
            runner._get(getter)
    with pytest.raises(TaskError, match="plain name"):
        runner.setup([{"type": "execute", "parameters": {"command": ["x"], "stdout": "../escape"}}])
    with pytest.raises(TaskError, match="file_cache"):
        Runner(None, (1280, 800), tmp_path, "")._get({"type": "cloud_file", "path": "https://h/a", "dest": "a"})


def _download_task(url, sha):
    return {"id": "h4-download", "instruction": "nothing to do", "config": [
                {"type": "download", "parameters": {"files": [{"url": url, "path": "/home/user/Desktop/in.bin"}]}}],
            "evaluator": {"func": "check_include_exclude",
                          "result": {"type": "vm_command_line", "command": "sha256sum /home/user/Desktop/in.bin",
                                     "shell": True},
                          "expected": {"type": "rule", "rules": {"include": [sha], "exclude": []}}}}


def test_a_task_whose_file_is_not_cached_is_refused_at_reset(cached, tmp_path, fake_vm):
    example = _download_task("https://files.example/other.bin", "0" * 64)
    task = Task("osworld/h4-download", "osworld", "h4-download", config={"example": example})
    env = OSWorldEnv(OSWorldSlots(provider="remote", remote_urls=(fake_vm.url,), file_cache=str(tmp_path / "files")))
    with pytest.raises(TaskError) as refused:
        env.reset(task)
    assert str(refused.value) == (f"OSWorld task h4-download: https://files.example/other.bin is not in the file "
                                  f"cache {tmp_path / 'files'}")
    assert fake_vm.commands == []  # refused before anything ran in the VM
    bare = OSWorldEnv(OSWorldSlots(provider="remote", remote_urls=(fake_vm.url,)))
    with pytest.raises(TaskError, match="set the slots' file_cache"):
        bare.reset(task)


@pytest.mark.vm
def test_download_reaches_the_real_vm_through_its_upload_route(cached, tmp_path):
    """A task's download step: the bytes from the host's file cache, pushed through the
    VM's /setup/upload, checked inside the VM by sha256sum (score 1); a corrupt cache
    entry is refused at setup."""
    files, bodies = cached
    url = "https://files.example/input.bin"
    example = _download_task(url, hashlib.sha256(bodies[url]).hexdigest())
    task = Task("osworld/h4-download", "osworld", "h4-download", config={"example": example})
    env = OSWorldEnv(dataclasses.replace(vm_slots(), file_cache=str(tmp_path / "files")))
    try:
        env.reset(task)
        assert env.evaluate() == 1.0
        wrong = _download_task(url, "0" * 64)
        env.reset(Task("osworld/h4-download", "osworld", "h4-download", config={"example": wrong}))
        assert env.evaluate() == 0.0
        blob = tmp_path / "files" / "sha256" / files.entries[url].sha256
        blob.write_bytes(b"x" * len(bodies[url]))
        again = {**example, "id": "h4-download-again"}  # a task with no snapshot yet runs its setup
        with pytest.raises(TaskError, match="does not match its sha256"):
            env.reset(Task("osworld/h4-download-again", "osworld", "h4-download-again", config={"example": again}))
    finally:
        env.close()
    assert json.loads((tmp_path / "files" / "manifest.json").read_text())["files"][url]["size"] == 3000


def test_the_sidecar_finds_the_tasks_host_files_where_osworlds_getters_look(cached, fake_vm):
    """OSWorld's cloud_file and cache_file getters read `<cache_dir>/<task id>/<name>`: the
    episode's folder, where the cloud_file files are staged from the file cache before the
    sidecar is asked (a sidecar here that scores 1 when both files are there)."""
    files, _ = cached
    example = {"id": "h2-staged", "instruction": "", "config": [
                   {"type": "execute", "parameters": {"command": ["echo", "x"], "stdout": "echo.out"}}],
               "evaluator": {"func": "compare_table", "result": {"type": "cache_file", "path": "echo.out"},
                             "expected": {"type": "cloud_file", "path": "https://files.example/gold.xlsx",
                                          "dest": "gold.xlsx"}}}
    program = ("import json, sys, pathlib; print(json.dumps({'ready': True}), flush=True)\n"
               "for line in sys.stdin:\n"
               "    r = json.loads(line); d = pathlib.Path(r['cache_dir']) / r['example']['id']\n"
               "    ok = (d / 'gold.xlsx').read_bytes() == b'gold' and (d / 'echo.out').is_file()\n"
               "    print(json.dumps({'score': float(ok)}), flush=True)")
    env = OSWorldEnv(OSWorldSlots(provider="remote", remote_urls=(fake_vm.url,), settle_s=0.0,
                                  file_cache=str(files.root), eval_sidecar=sys.executable))
    env.sidecar = EvalSidecar(command=[sys.executable, "-c", program])
    try:
        env.reset(Task("osworld/h2-staged", "osworld", "h2-staged", config={"example": example}))
        assert env.evaluate() == 1.0
    finally:
        env.close()


def test_an_until_step_repeats_until_its_output_shows_and_gives_up_after_its_time(tmp_path, fake_vm, monkeypatch):
    """`execute` with `until` (as OSWorld's setups wait for a window): asked again while the
    output lacks the text, done once it has it; an EnvError naming the step after UNTIL_S."""
    runner = Runner(VMClient(fake_vm.url, timeout_s=5), (1280, 800), tmp_path / "episode", "")
    step = {"type": "execute", "parameters": {"command": ["wmctrl", "-l"], "until": {"stdout": "[dot] (imported)"}}}
    fake_vm.outputs = ["", "0x1 0 dart-vm GNU Image Manipulation Program",
                       "0x1 0 dart-vm [dot] (imported)-1.0 (RGB color 8-bit) 64x48 – GIMP"]
    runner.setup([step])
    assert fake_vm.commands == [["wmctrl", "-l"]] * 3
    monkeypatch.setattr(evaluation, "UNTIL_S", 1.0)
    start = time.monotonic()
    with pytest.raises(EnvError, match=r"never met \{'stdout': '\[dot\] \(imported\)'\} in 1 s"):
        runner.setup([step])
    assert 1.0 <= time.monotonic() - start < 10
