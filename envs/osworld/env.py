"""OSWorld desktops: UI-TARS actions as pyautogui commands, scored by the official evaluator.

Two layers:

- Ours, always available: task JSON loading and checks (envs/osworld/checkout.py,
  `task_spec`), the UI-TARS -> pyautogui translation (`to_pyautogui`) and an HTTP client
  of the in-VM server on port 5000 (`VMClient`: /screenshot, /accessibility, /execute).
- `desktop-env` (the official package), imported lazily: its providers start and revert
  VMs (docker, vmware, virtualbox, aws, azure, gcp), its SetupController runs a task's
  `config` steps and its `DesktopEnv.evaluate` is the reward. desktop-env 1.0.2 pins
  numpy<2, torch~=2.5 and transformers~=4.35, so it cannot live in the trainer's
  environment: OSWorld env servers run in their own environment (the `envs` extra plus
  `desktop-env`).

Infeasible tasks are scored the official way: 1 when the agent's last action is FAIL
(UI-TARS `call_user()`), else 0. Nothing forces a FAIL at the step limit.

`provider: remote` drives an already running VM at `http://HOST:5000`; `provider: qemu`
boots one VM per slot on this host (envs/osworld/qemu.py) and resets it by restoring its ready
snapshot, or the task's own snapshot after its setup once one is saved
(envs/osworld/snapshots.py). With desktop-env importable both use the official setup and
evaluator (a remote VM is used as it is: nothing reverts it). Without desktop-env, tasks whose setup steps and
evaluator lie in envs/osworld/evaluation.py's subset run with the official semantics; other tasks
are refused on reset, unless the slots' `eval_sidecar` names desktop-env's environment: then
getters and metrics outside the subset run in OSWorld's own code (envs/osworld/sidecar.py),
and so does the whole evaluation of a task whose config says `"evaluator": "osworld"`. Tasks bundled with this repository (envs/osworld/tasks/, for the
desktop image `make setup-vm` builds) are named by their id alone; with the slots'
`osworld_dir` (a checkout of OSWorld), a task named by its id with config `{"domain": ...}`
is read from the checkout, and the files
they fetch on the host come from the slots' `file_cache` (envs/osworld/files.py): a task
whose file is not cached is refused at reset.
"""

from __future__ import annotations

import io
import json
import logging
import re
import shutil
import tempfile
import time
import urllib.request
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

from PIL import Image

from dart_jax.wire import paths
from envs import dom
from envs.config import OSWorldSlots
from envs.osworld import evaluation, httpcall
from envs.osworld.checkout import Checkout, load_task
from envs.osworld.files import FileCache, task_urls
from envs.osworld.sidecar import EvalSidecar
from envs.osworld.sidecar_main import remote_desktop_env
from envs.osworld.snapshots import TaskSnapshots, snapshot_name
from envs.types import Action, EnvError, Observation, StepResult, Task, TaskError

log = logging.getLogger(__name__)

PYAUTOGUI_PREFIX = "import pyautogui; import time; pyautogui.FAILSAFE = False; "
SPECIAL = {"wait": "WAIT", "finished": "DONE", "call_user": "FAIL"}
_PYAUTOGUI_KEYS = {"meta": "win", "esc": "esc"}
_SCROLL_CLICKS = 5
MAX_REPLY_BYTES = 64 << 20  # the VM's answers are read up to this (a screenshot is ~1 MiB)
MAX_ELEMENTS = 400  # lines of window / accessibility text per observation
BUNDLED_TASKS = Path(__file__).resolve().parent / "tasks"


# ---- tasks -------------------------------------------------------------------------------

def task_spec(example: dict, split: str = "train") -> Any:
    """The wire TaskSpec of an OSWorld example (the example travels whole in `config`)."""
    from dart_jax.wire.messages import TaskSpec
    return TaskSpec(task_id=f"osworld/{example['id']}", backend="osworld", name=example["id"],
                    split=split, config=json.dumps({"example": example}))


def bundled_tasks(image: str = "desktop") -> dict[str, dict]:
    """The OSWorld-format tasks bundled for an image target (`qemu.image`), by id:
    envs/osworld/tasks/*.json need only the small desktop image's applications (the
    `osworld` image has them too), tasks/osworld/*.json the `osworld` image's (LibreOffice,
    Chromium, ...)."""
    files = sorted(BUNDLED_TASKS.glob("*.json"))
    if image == "osworld":
        files += sorted((BUNDLED_TASKS / "osworld").glob("*.json"))
    return {t["id"]: t for t in map(load_task, files)}


def slot_image(spec: OSWorldSlots) -> str:
    """The image target whose bundled tasks the slots serve: their own with `provider: qemu`;
    a VM of another provider is taken to hold OSWorld's applications."""
    return spec.qemu.image if spec.provider == "qemu" else "osworld"


def _example(task: Task, spec: OSWorldSlots) -> dict:
    """The task's example: inline (`example`, a JSON object: a string would be read as a
    file name), the file `path` names, confined to the slots' `task_dir` (tasks come off
    the wire), the task of the slots' OSWorld checkout (`osworld_dir`) that the name and
    config `domain` name, or a bundled task named by its id."""
    if "example" in task.config:
        if not isinstance(task.config["example"], dict):
            raise TaskError(f"task {task.id}: config 'example' must be a JSON object")
        return load_task(task.config["example"])
    if "path" in task.config:
        return load_task(_task_file(task, spec.task_dir))
    if "domain" in task.config:
        if not spec.osworld_dir:
            raise TaskError(f"task {task.id}: config 'domain' needs the slots' osworld_dir (an OSWorld checkout)")
        return Checkout(Path(spec.osworld_dir)).task(task.config["domain"], task.name)
    bundled = bundled_tasks(slot_image(spec))
    if task.name in bundled:
        return bundled[task.name]
    if task.name in bundled_tasks("osworld"):
        raise TaskError(f"task {task.id}: a bundled task of the osworld image (make setup-vm-osworld); "
                        "these slots boot the desktop image (set qemu: {image: osworld})")
    raise TaskError(f"task {task.id}: config needs 'example' (an OSWorld task JSON) or 'path', "
                    f"'domain' (of the slots' OSWorld checkout), or the name of a bundled task "
                    f"({', '.join(sorted(bundled))})")


def _task_file(task: Task, task_dir: str) -> Path:
    name = task.config["path"]
    if not task_dir:
        raise TaskError(f"task {task.id}: config 'path' needs the slots' task_dir set on this env host")
    if not isinstance(name, str):
        raise TaskError(f"task {task.id}: config 'path' must be a string")
    try:
        return paths.confine(name, Path(task_dir), paths.roots(Path(task_dir)), field="config.path")
    except paths.PathRefused as e:
        raise TaskError(f"task {task.id}: {e}") from None


# ---- actions -------------------------------------------------------------------------------

def to_pyautogui(action: Action) -> str:
    """The pyautogui command for an action, or WAIT / DONE / FAIL (OSWorld's specials).
    Every string is embedded with repr(), so typed text cannot escape its literal."""
    if action.kind in SPECIAL:
        return SPECIAL[action.kind]
    x, y = _px(action.point) if action.point is not None else (None, None)
    if action.kind == "click":
        return f"pyautogui.click({x}, {y}, button='left')"
    if action.kind == "left_double":
        return f"pyautogui.doubleClick({x}, {y}, button='left')"
    if action.kind == "right_single":
        return f"pyautogui.click({x}, {y}, button='right')"
    if action.kind == "drag":
        x2, y2 = _px(action.end_point)
        return f"pyautogui.moveTo({x}, {y}); pyautogui.dragTo({x2}, {y2}, duration=0.5, button='left')"
    if action.kind == "hotkey":
        return f"pyautogui.hotkey({', '.join(repr(_PYAUTOGUI_KEYS.get(k, k)) for k in action.keys)})"
    if action.kind == "type":
        return _type_command(action.content)
    if action.kind == "scroll":
        where = f", x={x}, y={y}" if x is not None else ""
        clicks = _SCROLL_CLICKS if action.direction in ("up", "left") else -_SCROLL_CLICKS
        fn = "scroll" if action.direction in ("up", "down") else "hscroll"
        return f"pyautogui.{fn}({clicks}{where})"
    raise ValueError(f"no pyautogui form for {action.kind}")


def _type_command(content: str) -> str:
    """Paste through the clipboard (as UI-TARS' OSWorld agent does: any characters),
    then Enter for a trailing newline. The paste waits (5 s at most) until the clipboard
    gives the text back: pyperclip's copy returns before the clipboard's new owner (a forked
    xclip) holds it, and under TCG a Ctrl+V sent at once pasted nothing in gnome-terminal
    (1 of 6 pastes on a fresh VM here; 6 of 6 with the wait)."""
    text, enter = content.rstrip("\n"), content.endswith("\n")
    lines = [f"import pyperclip; pyperclip.copy({text!r}); until = time.time() + 5",
             f"while pyperclip.paste() != {text!r} and time.time() < until: time.sleep(0.1)",
             "pyautogui.hotkey('ctrl', 'v'); time.sleep(0.5)"] if text else []
    if enter:
        lines.append("pyautogui.press('enter')")
    return "\n".join(lines) or "pass"


def _px(point) -> tuple[int, int]:
    return int(round(point[0])), int(round(point[1]))


# ---- the in-VM server -----------------------------------------------------------------------

class VMClient:
    """HTTP client of OSWorld's in-VM server (`http://HOST:5000`); failures are EnvErrors."""

    def __init__(self, url: str, timeout_s: float = 60.0):
        self.url, self.timeout_s = url.rstrip("/"), timeout_s

    def screenshot(self) -> bytes:
        data = self._call("GET", "/screenshot")
        if not data.startswith(b"\x89PNG"):
            raise EnvError(f"{self.url}/screenshot did not return a PNG")
        return data

    def accessibility(self) -> str:
        try:
            return json.loads(self._call("GET", "/accessibility"))["AT"]
        except (ValueError, KeyError, TypeError) as e:
            raise EnvError(f"{self.url}/accessibility: unexpected answer ({e})") from None

    def execute(self, command: str) -> dict:
        return self.post_json("/execute", {"command": ["python", "-c", PYAUTOGUI_PREFIX + command], "shell": False})

    def post_json(self, path: str, body: dict, parse: bool = True) -> Any:
        data = self._call("POST", path, json.dumps(body).encode())
        if not parse:
            return data
        try:
            return json.loads(data)
        except ValueError as e:
            raise EnvError(f"{self.url}{path}: unexpected answer ({e})") from None

    def windows(self) -> tuple[list[tuple[str, str, tuple[int, int, int, int]]], str]:
        """([(window id, title, (x, y, w, h))], the active window's id) through wmctrl."""
        reply = self.post_json("/execute", {"command": "wmctrl -lG; echo active $(xdotool getactivewindow)",
                                            "shell": True})
        found, active = [], ""
        for line in str(reply.get("output", "")).splitlines():
            parts = line.split(None, 7)
            if parts[:1] == ["active"] and len(parts) == 2 and parts[1].isdigit():
                active = f"0x{int(parts[1]):08x}"
            elif len(parts) >= 7 and parts[0].startswith("0x") and all(p.lstrip("-").isdigit() for p in parts[2:6]):
                found.append((parts[0], parts[7] if len(parts) == 8 else "", tuple(int(p) for p in parts[2:6])))
        return found, active

    def file(self, path: str) -> bytes | None:
        """The VM's file at `path` (/file), or None when it does not exist."""
        try:
            return self._call("POST", "/file", urlencode({"file_path": path}).encode(),
                              "application/x-www-form-urlencoded")
        except _NotFound:
            return None

    def upload(self, data: bytes, path: str) -> None:
        if any(c in path for c in '\r\n"'):
            raise TaskError(f"upload path {path!r}: no quotes or line breaks")
        boundary = uuid.uuid4().hex
        body = (f'--{boundary}\r\nContent-Disposition: form-data; name="file_path"\r\n\r\n{path}\r\n'
                f'--{boundary}\r\nContent-Disposition: form-data; name="file_data"; filename="upload"\r\n'
                f"Content-Type: application/octet-stream\r\n\r\n").encode() + data + f"\r\n--{boundary}--\r\n".encode()
        self._call("POST", "/setup/upload", body, f"multipart/form-data; boundary={boundary}")

    def _call(self, method: str, path: str, body: bytes | None = None,
              content_type: str = "application/json") -> bytes:
        request = urllib.request.Request(self.url + path, data=body, method=method,
                                         headers={"Content-Type": content_type} if body is not None else {})
        try:
            return httpcall.call(request, self.timeout_s, MAX_REPLY_BYTES)
        except httpcall.StatusError as e:
            if e.code == 404:
                raise _NotFound(path) from None
            raise


class _NotFound(EnvError):
    """The VM's server answered 404."""


# ---- observations as element text ----------------------------------------------------------

_CP = "{https://accessibility.ubuntu.example.org/ns/component}"
_ST = "{https://accessibility.ubuntu.example.org/ns/state}"
_PAIR = re.compile(r"\((-?\d+), (-?\d+)\)")


def window_lines(windows, active: str, start: int = 1) -> list[str]:
    """The window list as envs.dom lines: `[n] window "title" (x,y,w,h) focused`."""
    return [dom.format_element(start + i, "window", title, box, focused=wid == active)
            for i, (wid, title, box) in enumerate(windows[:MAX_ELEMENTS])]


def accessibility_lines(xml: str, start: int = 1) -> list[str]:
    """OSWorld's accessibility tree (XML) as envs.dom lines: every showing element with a
    place on screen and a name or text, as OSWorld's agents linearize it."""
    try:
        root = ET.fromstring(xml)
    except ET.ParseError as e:
        raise EnvError(f"the VM's accessibility tree is not XML: {e}") from None
    lines = []
    for node in root.iter():
        coord, size = _PAIR.fullmatch(node.get(f"{_CP}screencoord", "")), _PAIR.fullmatch(node.get(f"{_CP}size", ""))
        label, text = node.get("name", ""), (node.text or "").strip()
        if coord is None or size is None or not (label or text) or node.get(f"{_ST}showing") != "true":
            continue
        box = (*map(int, coord.groups()), *map(int, size.groups()))
        if box[2] <= 0 or box[3] <= 0:
            continue
        lines.append(dom.format_element(start + len(lines), node.tag, label or text, box,
                                        value=text if label else "", focused=node.get(f"{_ST}focused") == "true"))
        if len(lines) == MAX_ELEMENTS:
            break
    return lines


# ---- the environment ---------------------------------------------------------------------

class OSWorldEnv:
    """One OSWorld desktop (implements `envs.types.Env`)."""

    def __init__(self, spec: OSWorldSlots, index: int = 0):
        self.spec = spec
        self.desktop = None  # desktop_env.DesktopEnv when the package is importable
        self.vm: VMClient | None = None
        self.machine = None  # envs.osworld.qemu.QemuVM for provider qemu
        self.snapshots: TaskSnapshots | None = None  # the machine's task snapshots
        if spec.provider in ("remote", "qemu"):
            url = spec.remote_urls[index] if spec.provider == "remote" else self._boot(index)
            self.vm = VMClient(url, spec.http_timeout_s)
            if _desktop_env_available():
                self.desktop = remote_desktop_env(url, (spec.screen_width, spec.screen_height), spec.cache_dir,
                                                  spec.os_type, spec.snapshot_name, spec.accessibility_tree,
                                                  **{f"{k}_port": v for k, v in self._ports().items()})
        else:
            if not _desktop_env_available():
                raise EnvError(f"OSWorld provider {spec.provider!r} needs the desktop-env package "
                               "(install it in the OSWorld host's own environment)")
            from desktop_env.desktop_env import DesktopEnv
            self.desktop = DesktopEnv(provider_name=spec.provider, region=spec.region or None,
                                      path_to_vm=spec.path_to_vm or None, snapshot_name=spec.snapshot_name,
                                      action_space="pyautogui", cache_dir=spec.cache_dir,
                                      screen_size=(spec.screen_width, spec.screen_height), headless=True,
                                      require_a11y_tree=spec.accessibility_tree, os_type=spec.os_type)
        # OSWorld's own evaluators for what envs/osworld/evaluation.py lacks (started on first use)
        self.sidecar = EvalSidecar(spec.eval_sidecar, call_timeout_s=spec.eval_timeout_s) \
            if spec.eval_sidecar and self.desktop is None else None
        self.example: dict | None = None
        self.own_evaluator = False  # the episode is scored by OSWorld's evaluator, not the fast path
        self.files: FileCache | None = None  # the file cache of the task under way
        self.history: list[str] = []
        # files the evaluator fetches from the VM land here (made on first use)
        self.cache = Path(tempfile.gettempdir()) / f"dart-osworld-cache-{uuid.uuid4().hex[:12]}"

    def _boot(self, index: int) -> str:
        from envs.osworld.qemu import QemuVM
        q = self.spec.qemu
        self.machine = QemuVM(q, (self.spec.screen_width, self.spec.screen_height), f"slot{index}")
        url = self.machine.start().url
        self.snapshots = TaskSnapshots(self.machine, q.task_snapshots, q.task_snapshot_mib,
                                       self.machine.dir / "task-files")
        return url

    def reset(self, task: Task) -> Observation:
        example = _example(task, self.spec)
        if self.desktop is None and (missing := evaluation.unsupported(example, evaluator=self.sidecar is None)):
            raise TaskError(f"OSWorld task {example['id']} uses {', '.join(missing)}: outside this host's "
                            "subset (envs/osworld/evaluation.py); install desktop-env for the rest"
                            + ("" if self.sidecar else ", or set eval_sidecar for OSWorld's own evaluators"))
        self.files = self._file_cache(example) if self.desktop is None else None
        self.own_evaluator = self._wants_own_evaluator(task)
        self.example, self.history = None, []
        shutil.rmtree(self.cache, ignore_errors=True)  # the episode's host files start empty
        if self.desktop is not None:
            if self.machine is not None:
                self.machine.restore()
            self.desktop.is_environment_used = False  # reverted above, or a remote VM used as it is
            obs = self.desktop.reset(task_config=example)
            self.example = example
            return self._observation(obs["screenshot"], obs.get("accessibility_tree"))
        saved = snapshot_name(example, self.files, self.spec.task_dir) if self.snapshots else None
        if not (saved and self.snapshots.restore(saved, self.cache)):
            if self.machine is not None:
                self.machine.restore()
            self._runner().setup(list(example.get("config") or []))
            if saved:
                self.snapshots.save(saved, self.cache)
        self.example = example
        return self._observe()

    def step(self, action: Action) -> StepResult:
        if self.example is None:
            raise RuntimeError("step before reset")
        command = to_pyautogui(action)
        if self.desktop is not None:
            obs, _, done, info = self.desktop.step(command, pause=self.spec.settle_s)
            return StepResult(self._observation(obs["screenshot"], obs.get("accessibility_tree")), done, info)
        self.history.append(command)
        if command not in SPECIAL.values():
            self.vm.execute(command)
        time.sleep(self.spec.settle_s * (2 if command == "WAIT" else 1))
        return StepResult(self._observe(), command in ("DONE", "FAIL"))

    def evaluate(self) -> float:
        if self.example is None:
            raise RuntimeError("evaluate before reset")
        if self.desktop is not None:
            return float(self.desktop.evaluate())
        last = self.history[-1] if self.history else None
        if self.sidecar is not None and (self.own_evaluator or evaluation.unsupported(self.example)):
            self._runner().stage_cloud_files(self.example["evaluator"])  # where OSWorld's getter looks
            return self.sidecar.evaluate(self.example, self.vm.url, last, self.cache,
                                         (self.spec.screen_width, self.spec.screen_height), self._ports())
        return self._runner().evaluate(self.example["evaluator"], last)

    def close(self) -> None:
        if self.desktop is not None and self.spec.provider not in ("remote", "qemu"):
            self.desktop.close()
        self.kill()

    def kill(self) -> None:
        """Stop the VM this slot booted (a no-op for VMs it did not start)."""
        if self.machine is not None:
            self.machine.kill()
        if self.sidecar is not None:
            self.sidecar.close()
        shutil.rmtree(self.cache, ignore_errors=True)

    def _wants_own_evaluator(self, task: Task) -> bool:
        """Whether the task's config asks for OSWorld's own evaluator (`"evaluator": "osworld"`)
        even where envs/osworld/evaluation.py could score it (`"auto"`, the default: the fast
        path where it can); that needs the sidecar, or desktop-env here, which always scores."""
        choice = task.config.get("evaluator", "auto")
        if choice not in ("auto", "osworld"):
            raise TaskError(f"task {task.id}: config 'evaluator' is 'auto' or 'osworld', not {str(choice)[:40]!r}")
        if choice == "osworld" and self.sidecar is None and self.desktop is None:
            raise TaskError(f"task {task.id}: OSWorld's own evaluator needs the slots' eval_sidecar "
                            "(make setup-osworld-eval)")
        return choice == "osworld"

    def _file_cache(self, example: dict) -> FileCache | None:
        """The slots' file cache, holding every file the task fetches on the host (or a
        TaskError naming the first that is not there)."""
        urls = task_urls(example)
        if not self.spec.file_cache:
            if urls:
                raise TaskError(f"OSWorld task {example['id']} fetches {urls[0][:200]} on the host: set the slots' "
                                "file_cache (python -m envs.osworld.catalog fill)")
            return None
        files = FileCache(self.spec.file_cache)
        if missing := files.missing(urls):
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise TaskError(f"OSWorld task {example['id']}: {missing[0][:200]} is not in the file cache "
                            f"{self.spec.file_cache}{more}")
        return files

    def _runner(self) -> evaluation.Runner:
        return evaluation.Runner(self.vm, (self.spec.screen_width, self.spec.screen_height), self.cache,
                                   self.spec.task_dir, self.files, self._devtools_url())

    def _ports(self) -> dict[str, int]:
        """Where the guest's browser DevTools and VLC's HTTP interface answer on the VM's host,
        when QEMU forwards them (empty: OSWorld's 9222 and 8080)."""
        if self.machine is None:
            return {}
        return {"chromium": self.machine.devtools_port, "vlc": self.machine.vlc_port}

    def _devtools_url(self) -> str:
        """The guest browser's DevTools port: forwarded by QEMU, or port 9222 of a remote VM."""
        if self.machine is not None:
            return self.machine.devtools_url
        return f"http://{urlsplit(self.vm.url).hostname}:9222" if self.vm is not None else ""

    def _observe(self) -> Observation:
        return self._observation(self.vm.screenshot(), self.vm.accessibility() if self.spec.accessibility_tree else "")

    def _observation(self, png: bytes | None, tree: str | None) -> Observation:
        if not png:
            raise EnvError("the VM returned no screenshot")
        try:
            width, height = Image.open(io.BytesIO(png)).size
        except Exception as e:
            raise EnvError(f"the VM's screenshot is unreadable: {e}") from None
        lines = window_lines(*self.vm.windows()) if self.spec.observe_windows and self.vm else []
        if tree:
            lines += accessibility_lines(tree, start=len(lines) + 1)
        return Observation(png, width, height, self.example["instruction"], "\n".join(lines))


def _desktop_env_available() -> bool:
    try:
        import desktop_env.desktop_env  # noqa: F401
        return True
    except Exception:  # absent, or broken by its pins: the caller says what is missing
        return False

