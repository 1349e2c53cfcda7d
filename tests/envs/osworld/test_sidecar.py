"""OSWorld's own evaluator in a sidecar: a hung, dead or babbling sidecar is an EnvError and
leaves no process; with desktop-env's environment (marker osworld_eval) and a VM, OSWorld's
DesktopEnv.evaluate agrees with envs/osworld/evaluation.py on every bundled task."""

import asyncio
import sys

import pytest

from envs import oracle
from envs.osworld import sidecar as sidecar_module
from envs.osworld.env import bundled_tasks
from envs.osworld.sidecar import VENV, EvalSidecar
from envs.config import OSWorldSlots
from envs.osworld.env import OSWorldEnv
from envs.types import Action, EnvError, Task, TaskError

from tests.envs.conftest import alive, client, observation, run, spec

EXAMPLE = {"id": "x", "instruction": "", "config": [], "evaluator": {"func": "infeasible"}}
READY = "import json, sys; print(json.dumps({'ready': True}), flush=True); "


def _evaluate(sidecar: EvalSidecar, task_files) -> float:
    return sidecar.evaluate(EXAMPLE, "http://127.0.0.1:9", "FAIL", task_files, (1280, 800))


@pytest.mark.parametrize("program, why", [
    ("time.sleep(60)", "no answer within 1 s"),
    (READY + "sys.stdin.readline(); time.sleep(60)", "no answer within 1 s"),
    (READY + "sys.stdin.readline(); sys.stderr.write('boom'); sys.exit(3)", "exited: boom"),
    (READY + "sys.stdin.readline(); print('not json', flush=True); time.sleep(60)", "not a JSON object"),
    (READY + "sys.stdin.readline(); print('x' * (2 << 20), flush=True)", "over 1048576 bytes"),
    (READY + "sys.stdin.readline(); print(json.dumps({'score': 'high'}), flush=True)", "not a number"),
    (READY + "sys.stdin.readline(); print(json.dumps({'error': 'no getter'}), flush=True)", "no getter"),
])
def test_a_sidecar_that_hangs_dies_or_babbles_is_an_env_error_and_is_killed(program, why, monkeypatch, tmp_path):
    hangs_at_start = not program.startswith(READY)
    sidecar = EvalSidecar(start_timeout_s=1.0 if hangs_at_start else 30.0, call_timeout_s=1.0,
                          command=[sys.executable, "-c", "import time; " + program])
    started = []
    spawn = sidecar_module.process_groups.spawn
    monkeypatch.setattr(sidecar_module.process_groups, "spawn", lambda *a, **k: started.append(spawn(*a, **k))
                        or started[-1])
    try:
        with pytest.raises(EnvError, match=why):
            _evaluate(sidecar, tmp_path)
    finally:
        sidecar.close()
    started = [p for p in started if p.args[:2] == [sys.executable, "-c"]]  # not the reaper's watchdog
    assert len(started) == 1 and not alive(started[0].pid)


def test_a_sidecar_answers_in_order_and_a_fresh_one_follows_a_dead_one(tmp_path):
    program = READY + ("n = 0\nfor line in sys.stdin:\n    n += 1\n    n == 2 and sys.exit(1)\n"
                       "    print(json.dumps({'score': n / 10}), flush=True)")
    sidecar = EvalSidecar(start_timeout_s=30.0, call_timeout_s=30.0, command=[sys.executable, "-c", program])
    try:
        assert _evaluate(sidecar, tmp_path) == 0.1
        first = sidecar.process.pid
        with pytest.raises(EnvError, match="exited"):
            _evaluate(sidecar, tmp_path)
        assert sidecar.process is None and not alive(first)
        assert _evaluate(sidecar, tmp_path) == 0.1  # a fresh sidecar
        assert sidecar.process.pid != first
    finally:
        sidecar.close()


def test_no_sidecar_python_is_an_env_error_naming_the_setup_target(tmp_path):
    with pytest.raises(EnvError, match="make setup-osworld-eval"):
        _evaluate(EvalSidecar(python=tmp_path / "missing" / "python"), tmp_path)
    with pytest.raises(TaskError, match="needs a plain id"):  # desktop-env makes a folder by that name
        EvalSidecar(python=tmp_path / "missing").evaluate({**EXAMPLE, "id": "../x"}, "", None, tmp_path, (1, 1))


def test_the_env_sends_what_its_subset_lacks_to_the_sidecar_and_a_dead_one_is_an_env_error(fake_vm):
    """This environment's Python has no desktop-env: the sidecar dies importing it, and the
    episode's evaluate is an EnvError carrying why (the server ends it as env_error)."""
    table = {**EXAMPLE, "id": "calc", "evaluator": {"func": "compare_table", "result": {"type": "vm_file", "path": "/a"},
                                                     "expected": {"type": "vm_file", "path": "/b"}}}
    task = Task("osworld/calc", "osworld", "calc", config={"example": table})
    with pytest.raises(TaskError, match="or set eval_sidecar"):
        OSWorldEnv(OSWorldSlots(provider="remote", remote_urls=(fake_vm.url,))).reset(task)
    env = OSWorldEnv(OSWorldSlots(provider="remote", remote_urls=(fake_vm.url,), settle_s=0.0,
                                  eval_sidecar=sys.executable))
    try:
        env.reset(task)
        with pytest.raises(EnvError, match="(?s)exited: .*No module named 'desktop_env'"):
            env.evaluate()
        env.reset(Task("osworld/x", "osworld", "x", config={"example": EXAMPLE}))
        env.step(Action(kind="call_user"))
        assert env.evaluate() == 1.0 and env.sidecar.process is None  # its own subset: no sidecar
        env.reset(Task("osworld/x", "osworld", "x", config={"example": EXAMPLE, "evaluator": "osworld"}))
        with pytest.raises(EnvError, match="No module named 'desktop_env'"):  # asked for OSWorld's own
            env.evaluate()
        with pytest.raises(TaskError, match="'auto' or 'osworld'"):
            env.reset(Task("osworld/x", "osworld", "x", config={"example": EXAMPLE, "evaluator": "ours"}))
    finally:
        env.close()
    plain = OSWorldEnv(OSWorldSlots(provider="remote", remote_urls=(fake_vm.url,)))
    with pytest.raises(TaskError, match="needs the slots' eval_sidecar"):
        plain.reset(Task("osworld/x", "osworld", "x", config={"example": EXAMPLE, "evaluator": "osworld"}))
    plain.close()


@pytest.mark.vm
@pytest.mark.osworld_eval
def test_osworlds_evaluator_agrees_with_ours_on_every_bundled_task(vm_server):
    """Each bundled task solved by its oracle and left unsolved, scored by OSWorld's
    DesktopEnv.evaluate in the sidecar and by envs/osworld/evaluation.py, on the session's VM."""
    envs, endpoint = vm_server
    sidecar = EvalSidecar(VENV / "bin" / "python")

    async def main():
        c = client(endpoint, step_timeout_s=150.0, reset_timeout_s=450.0)
        scores = {}
        try:
            env = await c.acquire("osworld")
            for name in sorted(bundled_tasks()):
                for solved in (True, False):
                    reply, history = await env.reset(spec("osworld", name)), []
                    for _ in range(10 if solved else 0):
                        if reply.done or reply.status == "env_error":
                            break
                        history.append(oracle.act("osworld", name, observation(reply), history))
                        reply = await env.step(history[-1])
                    backend = envs.slots[env.slot].env  # started by the first reset
                    last = backend.history[-1] if backend.history else None
                    theirs = await asyncio.to_thread(sidecar.evaluate, backend.example, backend.vm.url, last,
                                                     backend.cache, (1280, 800))
                    scores[name, solved] = ((await env.evaluate()).reward, theirs)
        finally:
            await c.aclose()
        return scores

    try:
        scores = run(main())
    finally:
        sidecar.close()
    assert all(ours == theirs for ours, theirs in scores.values()), scores
    assert {key: ours for key, (ours, _) in scores.items()} == {key: float(key[1]) for key in scores}, scores
