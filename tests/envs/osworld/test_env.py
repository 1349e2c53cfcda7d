"""OSWorld without a VM: task loading, action translation, the in-VM HTTP client, errors;
and one integration test against a real VM (marker `osworld`, DART_OSWORLD_URL)."""

import json
import os

import pytest

from envs import actions
from envs.config import OSWorldSlots
from envs.osworld.checkout import load_task
from envs.osworld.env import OSWorldEnv, VMClient, task_spec, to_pyautogui
from envs.types import Action, EnvError, Task, TaskError

from tests.envs.conftest import INFEASIBLE_TASK


def test_load_task_checks_the_example(tmp_path):
    assert load_task(INFEASIBLE_TASK) == INFEASIBLE_TASK
    assert load_task(json.dumps(INFEASIBLE_TASK))["id"] == "infeasible-demo"
    path = tmp_path / "t.json"
    path.write_text(json.dumps(INFEASIBLE_TASK))
    assert load_task(path) == load_task(str(path))
    for bad, why in [({**INFEASIBLE_TASK, "evaluator": "x"}, "evaluator"), ({"id": "a"}, "instruction"),
                     ({**INFEASIBLE_TASK, "config": {}}, "config"), ("[1, 2]", "JSON object"),
                     ({**INFEASIBLE_TASK, "evaluator": {"func": 3}}, "func"), ("{oops", "not JSON"),
                     (tmp_path / "missing.json", "cannot read")]:
        with pytest.raises(TaskError, match=why):
            load_task(bad)


def test_task_spec_carries_the_example_whole():
    spec = task_spec({**INFEASIBLE_TASK, "id": "b2"})
    assert (spec.task_id, spec.backend, json.loads(spec.config)["example"]["id"]) == ("osworld/b2", "osworld", "b2")


DESKTOP = (1920, 1080)


@pytest.mark.parametrize("text, command", [
    ("Action: click(start_box='(966,546)')", "pyautogui.click(960, 540, button='left')"),
    ("Action: left_double(start_box='(0,0)')", "pyautogui.doubleClick(0, 0, button='left')"),
    ("Action: right_single(start_box='(1932,1092)')", "pyautogui.click(1919, 1079, button='right')"),
    ("Action: drag(start_box='(0,0)', end_box='(966,546)')",
     "pyautogui.moveTo(0, 0); pyautogui.dragTo(960, 540, duration=0.5, button='left')"),
    ("Action: hotkey(key='ctrl alt t')", "pyautogui.hotkey('ctrl', 'alt', 't')"),
    ("Action: hotkey(key='cmd space')", "pyautogui.hotkey('win', 'space')"),
    ("Action: type(content='x\\n')", "import pyperclip; pyperclip.copy('x'); until = time.time() + 5\n"
                                      "while pyperclip.paste() != 'x' and time.time() < until: time.sleep(0.1)\n"
                                      "pyautogui.hotkey('ctrl', 'v'); time.sleep(0.5)\npyautogui.press('enter')"),
    ("Action: type(content='\\n')", "pyautogui.press('enter')"),
    ("Action: scroll(start_box='(966,546)', direction='down')", "pyautogui.scroll(-5, x=960, y=540)"),
    ("Action: scroll(direction='left')", "pyautogui.hscroll(5)"),
    ("Action: wait()", "WAIT"), ("Action: finished(content='ok')", "DONE"), ("Action: call_user()", "FAIL"),
])
def test_ui_tars_to_pyautogui(text, command):
    assert to_pyautogui(actions.parse(text, DESKTOP)) == command


def test_typed_text_cannot_escape_its_literal():
    nasty = "'); import os; os.system('rm -rf /'); ('\\\"\n"
    command = to_pyautogui(Action(kind="type", content=nasty + "z"))
    copied = command.split("pyperclip.copy(")[1].split("); until = ")[0]
    awaited = command.split("pyperclip.paste() != ")[1].split(" and time.time() < until")[0]
    for literal in (copied, awaited):
        assert eval(literal, {"__builtins__": {}}) == nasty + "z"  # a plain string literal, nothing else
    compile(command, "<type>", "exec")  # and the whole is one program


def test_vm_client_against_a_fake_vm(fake_vm):
    vm = VMClient(fake_vm.url, timeout_s=5)
    assert vm.screenshot().startswith(b"\x89PNG") and vm.accessibility() == "<desktop-frame/>"
    assert vm.execute("pyautogui.click(1, 2)")["status"] == "success"
    assert fake_vm.commands[-1][:2] == ["python", "-c"] and fake_vm.commands[-1][2].endswith("pyautogui.click(1, 2)")
    with pytest.raises(EnvError, match="failed"):
        VMClient("http://127.0.0.1:9", timeout_s=2).screenshot()


def test_remote_env_official_infeasible_scoring(fake_vm):
    env = OSWorldEnv(OSWorldSlots(provider="remote", remote_urls=(fake_vm.url,), settle_s=0.0))
    task = Task("osworld/x", "osworld", "x", config={"example": INFEASIBLE_TASK})
    obs = env.reset(task)
    assert (obs.width, obs.height, obs.instruction) == (1920, 1080, INFEASIBLE_TASK["instruction"])
    env.step(Action(kind="click", point=(5, 5)))
    assert env.evaluate() == 0.0  # ran out of steps without FAIL: not solved (no forced FAIL)
    assert env.step(Action(kind="call_user")).done and env.evaluate() == 1.0
    env.reset(task)
    env.step(Action(kind="finished"))
    assert env.evaluate() == 0.0


def test_tasks_needing_desktop_env_are_refused_without_it(fake_vm):
    env = OSWorldEnv(OSWorldSlots(provider="remote", remote_urls=(fake_vm.url,)))
    needs = {**INFEASIBLE_TASK, "evaluator": {"func": "exact_match", "result": {}, "expected": {}}}
    with pytest.raises(TaskError, match="desktop-env"):
        env.reset(Task("osworld/y", "osworld", "y", config={"example": needs}))
    with pytest.raises(EnvError, match="desktop-env"):
        OSWorldEnv(OSWorldSlots(provider="docker"))


def test_remote_config_needs_one_url_per_slot():
    from envs.config import EnvServerConfig
    with pytest.raises(ValueError, match="remote_urls"):
        EnvServerConfig(slots=(OSWorldSlots(provider="remote", count=2, remote_urls=("http://127.0.0.1:5000",)),))


@pytest.mark.osworld
def test_real_vm_screenshot_and_infeasible_episode():
    url = os.environ["DART_OSWORLD_URL"]
    env = OSWorldEnv(OSWorldSlots(provider="remote", remote_urls=(url,)))
    obs = env.reset(Task("osworld/x", "osworld", "x", config={"example": INFEASIBLE_TASK}))
    assert obs.width > 0 and obs.screenshot.startswith(b"\x89PNG")
    env.step(Action(kind="scroll", direction="down"))
    assert env.step(Action(kind="call_user")).done and env.evaluate() == 1.0
