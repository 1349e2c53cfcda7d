"""The `osworld` image (markers `vm` and `osworld_image`: skipped where `make
setup-vm-osworld` has not built it; one VM shared by the session): its settings take effect
in the guest, and every bundled task of OSWorld's application domains is solved by its
oracle through the env server and scored 1 by envs/osworld/evaluation.py, 0 left unsolved, and
(marker `osworld_eval`) by OSWorld's own metric in the env server's sidecar, as the fast path
scores it."""

import base64
import json
import urllib.request

import pytest

from envs.config import OSWorldSlots, QemuSettings
from envs.osworld.cdp import DevTools
from envs.osworld import evaluation
from envs.osworld.env import _example, bundled_tasks
from envs.types import Task, TaskError

from tests.envs.conftest import desktop_env, oracle_episode, run, spec

DOMAIN_TASKS = sorted(set(bundled_tasks("osworld")) - set(bundled_tasks("desktop")))
# those envs/osworld/evaluation.py scores too (the rest need OSWorld's own getters: the sidecar)
FAST_PATH_TASKS = [name for name in DOMAIN_TASKS if not evaluation.unsupported(bundled_tasks("osworld")[name])]


def test_the_osworld_image_has_a_task_per_application_domain():
    apps = {app for name in DOMAIN_TASKS for app in bundled_tasks("osworld")[name]["related_apps"]}
    assert {"libreoffice_calc", "libreoffice_writer", "libreoffice_impress", "os", "vlc", "gimp", "chrome",
            "thunderbird"} <= apps
    # a task of several applications, as OSWorld's multi_apps domain has
    assert any(bundled_tasks("osworld")[name]["snapshot"] == "multi_apps" for name in DOMAIN_TASKS)


def test_a_domain_task_is_refused_on_slots_of_the_small_image():
    name = DOMAIN_TASKS[0]
    task = Task(f"osworld/{name}", "osworld", name)
    with pytest.raises(TaskError, match=r"bundled task of the osworld image .*\(set qemu: \{image: osworld\}"):
        _example(task, OSWorldSlots(provider="qemu"))
    assert _example(task, OSWorldSlots(provider="qemu", qemu=QemuSettings(image="osworld")))["id"] == name


@pytest.mark.vm
@pytest.mark.osworld_image
@pytest.mark.parametrize("name", FAST_PATH_TASKS)
def test_each_domain_task_scores_1_solved_by_its_oracle_and_0_left_alone(name, osworld_vm_server):
    """One case per task (the six in one test took 675 s under TCG, near pytest's 900 s)."""
    _, endpoint = osworld_vm_server

    async def main():
        async with desktop_env(endpoint) as env:
            await env.reset(spec("osworld", name))  # the setup runs; its snapshot is saved
            left = await env.evaluate()
            solved = await oracle_episode(env, spec("osworld", name), max_steps=25)  # restores it
            return left.reward, solved.reward, solved.status

    assert run(main()) == (0.0, 1.0, "success")


@pytest.mark.vm
@pytest.mark.osworld_image
@pytest.mark.osworld_eval
@pytest.mark.parametrize("name", DOMAIN_TASKS)
def test_osworlds_own_metric_in_the_sidecar_scores_each_domain_task_and_the_fast_path_agrees(name, osworld_vm_server):
    """Through the env server with config `"evaluator": "osworld"`: the task left alone and
    solved by its oracle, scored by OSWorld's DesktopEnv.evaluate in the server's sidecar,
    and on the same VM state by envs/osworld/evaluation.py (the fast path) where it can (None:
    the task's getter is OSWorld's alone). One case per task (each a few minutes under TCG),
    all on the session's VM."""
    envs, endpoint = osworld_vm_server

    def fast_path(slot: int) -> float | None:
        backend = envs.slots[slot].env
        assert backend.sidecar.process is not None  # the server's score came from the sidecar
        if evaluation.unsupported(backend.example):
            return None
        return backend._runner().evaluate(backend.example["evaluator"], (backend.history or [None])[-1])

    async def main():
        async with desktop_env(endpoint) as env:
            task = spec("osworld", name, config={"evaluator": "osworld"})
            await env.reset(task)
            left = (await env.evaluate()).reward, fast_path(env.slot)
            solved = await oracle_episode(env, task, max_steps=25)
            return (*left, solved.reward, fast_path(env.slot), solved.status)

    fast = name in FAST_PATH_TASKS
    assert run(main()) == (0.0, 0.0 if fast else None, 1.0, 1.0 if fast else None, "success")


@pytest.mark.vm
@pytest.mark.osworld_image
def test_the_images_settings_take_effect_in_the_guest(osworld_vm_server):
    """google-chrome answers DevTools and VLC its HTTP interface on the host's loopback
    (QEMU's forwards of the guest's 9222 and 8080); indexers masked; no screen saver."""
    envs, endpoint = osworld_vm_server

    async def main():
        async with desktop_env(endpoint) as env:
            await env.reset(spec("osworld", "os-infeasible-16k"))  # the ready desktop, no setup
            return envs.slots[env.slot].env

    backend = run(main())
    runner = backend._runner()
    runner.setup([{"type": "launch", "parameters": {"command": ["vlc"]}},
                  {"type": "launch", "parameters": {"command": ["google-chrome"]}}])
    DevTools(backend.machine.devtools_url).wait(180)  # Chromium starts in 20-70 s under TCG
    assert any(t["url"].startswith("chrome://newtab") for t in DevTools(backend.machine.devtools_url).tabs())
    request = urllib.request.Request(backend.machine.vlc_url + "/requests/status.xml",
                                     headers={"Authorization": "Basic " + base64.b64encode(b":password").decode()})
    with urllib.request.urlopen(request, timeout=30) as reply:
        assert b"<apiversion>" in reply.read()
    shell = backend.vm.post_json("/execute", {"shell": True, "command": (
        "systemctl --global is-enabled tracker-miner-fs-3.service tracker-extract-3.service; "
        "xset -display :0 q | grep timeout")})["output"]
    assert shell.split()[:4] == ["masked", "masked", "timeout:", "0"], shell


@pytest.mark.vm
@pytest.mark.osworld_image
def test_the_terminal_route_reads_the_focused_gnome_terminal(osworld_vm_server):
    """/terminal (OSWorld's route) reads gnome-terminal's text through AT-SPI: null on the
    desktop without one, the prompt once the os task's setup started one, and the command
    the oracle typed after its episode."""
    envs, endpoint = osworld_vm_server

    def terminal(env) -> str | None:
        with urllib.request.urlopen(envs.slots[env.slot].env.vm.url + "/terminal", timeout=60) as reply:
            return json.loads(reply.read())["output"]

    async def main():
        async with desktop_env(endpoint) as env:
            await env.reset(spec("osworld", "os-infeasible-16k"))
            bare = terminal(env)
            task = spec("osworld", "os-terminal-move-txt")
            await env.reset(task)
            started = terminal(env)
            solved = await oracle_episode(env, task, max_steps=25)
            return bare, started, solved.reward, terminal(env)

    bare, started, reward, after = run(main())
    assert bare is None and reward == 1.0
    assert started.endswith("user@dart-vm:~$") and "mv" not in started, started
    assert "mv ~/inbox/*.txt ~/archive/" in after and after.endswith("user@dart-vm:~/archive$"), after
