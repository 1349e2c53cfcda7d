"""A snapshot per task after its setup: restored instead of re-running the setup, bounded
by count and saved memory (least recently used evicted), nothing saved when the setup fails."""

import dataclasses
import json

import pytest

from envs.osworld import evaluation
from envs.osworld.env import OSWorldEnv
from envs.osworld.files import FileCache
from envs.osworld.snapshots import TaskSnapshots, snapshot_name
from envs.osworld.qemu import SNAPSHOT
from envs.types import Task, TaskError

from tests.envs.conftest import vm_slots

SETUP_ID = "/home/user/setup-id"


def _task(task_id: str, fail: bool = False) -> Task:
    """A task whose setup writes a fresh random id in the VM (and keeps it on the host as
    `setup-id.txt`): a setup that ran again writes another one."""
    steps = [{"type": "execute", "parameters": {"command": f"cat /proc/sys/kernel/random/uuid | tee {SETUP_ID}",
                                                "shell": True, "stdout": "setup-id.txt"}}]
    if fail:  # no task_dir on this host: refused after the first step ran
        steps.append({"type": "upload_file", "parameters": {"files": [{"local_path": "a", "path": "/tmp/a"}]}})
    example = {"id": task_id, "instruction": "nothing to do", "config": steps,
               "evaluator": {"func": "check_include_exclude",
                             "result": {"type": "cache_file", "path": "setup-id.txt"},
                             "expected": {"type": "rule", "rules": {"include": ["-"], "exclude": []}}}}
    return Task(f"osworld/{task_id}", "osworld", task_id, config={"example": example})


def _name(task: Task) -> str:
    return snapshot_name(task.config["example"], None, "")


@pytest.mark.vm
def test_later_resets_restore_the_task_snapshot_and_the_bound_evicts_the_least_recent(monkeypatch):
    ran = []  # the task setups that ran (evaluate runs the evaluator's postconfig, empty here)
    setup = evaluation.Runner.setup
    monkeypatch.setattr(evaluation.Runner, "setup", lambda self, steps: (steps and ran.append(steps), setup(self, steps)))
    env = OSWorldEnv(dataclasses.replace(vm_slots(), qemu=dataclasses.replace(vm_slots().qemu, task_snapshots=2)))
    vm = env.vm

    def reset(task: Task) -> tuple[bytes, str]:
        env.reset(task)
        return vm.file(SETUP_ID), (env.cache / "setup-id.txt").read_text()

    try:
        a, b, c = _task("h4-a/1"), _task("h4 b"), _task("h4-c")
        first = reset(a)
        assert first[0].decode() == first[1] and len(first[1].strip()) == 36
        vm.post_json("/setup/execute", {"command": f"echo dirty > {SETUP_ID}", "shell": True})
        assert reset(a) == first  # restored: the VM's file and the host's copy as the setup left them
        assert env.evaluate() == 1.0 and len(ran) == 1  # the setup ran once
        reset(b)
        assert reset(a) == first and len(ran) == 2  # a is now the most recent, b the least
        reset(c)
        assert set(env.machine.snapshots()) == {SNAPSHOT, _name(a), _name(c)} and len(ran) == 3
        assert reset(a) == first and len(ran) == 3
        reset(b)
        assert len(ran) == 4  # evicted: its setup ran again
        with pytest.raises(TaskError, match="upload_file needs"):
            env.reset(_task("h4-fails", fail=True))
        failed = _name(_task("h4-fails", fail=True))
        assert failed not in env.machine.snapshots() and not (env.snapshots.store / failed).exists()
        assert set(env.machine.snapshots()) == {SNAPSHOT, _name(a), _name(b)}  # the bound of 2
    finally:
        env.close()


class _Recorder:
    """A VM's snapshot calls, each snapshot `size` bytes of saved memory."""

    def __init__(self, size: int):
        self.size, self.saved, self.calls = size, {}, []

    def save(self, snapshot):
        self.saved[snapshot] = self.size
        self.calls.append(("savevm", snapshot))

    def restore(self, snapshot):
        self.calls.append(("loadvm", snapshot))

    def delete(self, snapshot):
        del self.saved[snapshot]
        self.calls.append(("delvm", snapshot))

    def snapshots(self):
        return dict(self.saved)


def test_the_saved_memory_bound_evicts_the_least_recently_used(tmp_path):
    vm = _Recorder(size=300 << 20)
    snapshots = TaskSnapshots(vm, max_count=8, max_mib=700, store=tmp_path / "store")
    files = tmp_path / "episode"
    files.mkdir()
    (files / "out.txt").write_text("one")
    snapshots.save("task-a", files)
    snapshots.save("task-b", files)
    assert snapshots.restore("task-a", tmp_path / "restored")
    assert (tmp_path / "restored" / "out.txt").read_text() == "one"
    snapshots.save("task-c", files)  # 900 MiB > 700: b, the least recently used, goes
    assert set(vm.saved) == {"task-a", "task-c"} and ("delvm", "task-b") in vm.calls
    assert not (tmp_path / "store" / "task-b").exists()
    assert not snapshots.restore("task-b", files) and vm.calls[-1] == ("delvm", "task-b")
    too_big = TaskSnapshots(_Recorder(size=800 << 20), max_count=8, max_mib=700, store=tmp_path / "big")
    too_big.save("task-a", files)
    assert too_big.vm.saved == {}  # alone over the bound: deleted at once
    none = TaskSnapshots(_Recorder(size=1), max_count=0, max_mib=700, store=tmp_path / "none")
    none.save("task-a", files)
    assert none.vm.calls == []


def test_snapshot_names_are_safe_and_change_with_what_the_setup_depends_on(tmp_path):
    example = {"id": "a b/../c;d", "config": [{"type": "download", "parameters": {"files": [
        {"url": "https://files.example/x", "path": "/tmp/x"}]}}]}
    name = snapshot_name(example, None, "")
    assert name.startswith("task-a_b_.._c_d-") and all(ch.isalnum() or ch in "_.-" for ch in name)

    caches = []
    for digit in "01":
        root = tmp_path / f"cache{digit}"
        root.mkdir()
        (root / "manifest.json").write_text(json.dumps(
            {"version": 1, "files": {"https://files.example/x": {"sha256": digit * 64, "size": 1}}}))
        caches.append(FileCache(root))
    assert len({snapshot_name(example, caches[0], ""), snapshot_name(example, caches[1], ""), name}) == 3
    edited = {**example, "config": example["config"] + [{"type": "sleep", "parameters": {"seconds": 1}}]}
    assert snapshot_name(edited, None, "") != name
    assert snapshot_name({"id": "x", "config": []}, None, "") is None
    (tmp_path / "up.txt").write_text("1")
    upload = {"id": "u", "config": [{"type": "upload_file", "parameters": {"files": [{"local_path": "up.txt",
                                                                                       "path": "/tmp/u"}]}}]}
    before = snapshot_name(upload, None, str(tmp_path))
    (tmp_path / "up.txt").write_text("22")
    assert snapshot_name(upload, None, str(tmp_path)) != before
    assert len(snapshot_name({"id": "i" * 300, "config": example["config"]}, None, "")) <= 5 + 64 + 17
