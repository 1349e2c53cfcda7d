"""MiniWoB++ (the `miniwob` package) in headless Chromium, driven with UI-TARS actions.

One browser per env; switching tasks navigates the same browser. We reuse miniwob's
`SeleniumInstance` for the page protocol (seeding, starting episodes, metadata) but
create the driver ourselves (Debian's chromium, our flags, its own process group so a
wedged browser can be killed whole) and perform actions with W3C input actions:

- click / left_double / right_single at screen pixels (= page CSS pixels: the task area
  sits at the page's top-left corner);
- drag: pointer down, moves, pointer up; scroll: the mouse wheel at a point;
- hotkey: keys down in order, up in reverse; type: per-character keys, "\\n" = Enter;
- wait: a short sleep; finished / call_user: end the episode without touching the page.

Rewards are the task's raw reward (no time scaling), clipped to [0, 1]; the page's
wall-clock episode limit is lifted so slow policies are not cut off.
"""

from __future__ import annotations

import functools
import io
import time
from typing import Any

from PIL import Image
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.keys import Keys

from dart_jax.wire import process_groups
from envs import dom, reaper
from envs.config import MiniWoBSlots
from envs.types import Action, Observation, StepResult, Task, TaskError

# setTimeout's largest delay (~24.8 days); anything larger fires at once.
_NO_LIMIT_MS = 2**31 - 1
_WAIT_S = 0.5
_STATE_JS = ("return {done: WOB_DONE_GLOBAL, reason: WOB_REWARD_REASON, "
             "utterance: core.getUtterance(), dom: core.getDOMInfo()};")
_KEYS = {"ctrl": Keys.CONTROL, "shift": Keys.SHIFT, "alt": Keys.ALT, "meta": Keys.META,
         "enter": Keys.ENTER, "tab": Keys.TAB, "esc": Keys.ESCAPE, "space": Keys.SPACE,
         "backspace": Keys.BACKSPACE, "delete": Keys.DELETE, "insert": Keys.INSERT,
         "home": Keys.HOME, "end": Keys.END, "pageup": Keys.PAGE_UP, "pagedown": Keys.PAGE_DOWN,
         "up": Keys.ARROW_UP, "down": Keys.ARROW_DOWN, "left": Keys.ARROW_LEFT,
         "right": Keys.ARROW_RIGHT,
         **{f"f{i}": getattr(Keys, f"F{i}") for i in range(1, 13)}}


@functools.cache
def task_names() -> list[str]:
    """Every MiniWoB++ task the package registers (128 in miniwob 1.1.0)."""
    import gymnasium
    import miniwob  # noqa: F401  (registers the environments)
    return sorted(name[len("miniwob/"):-len("-v1")] for name in gymnasium.envs.registry
                  if name.startswith("miniwob/"))


def _instance_class():
    from miniwob.selenium_instance import SeleniumInstance

    class Instance(SeleniumInstance):
        """miniwob's page protocol on a driver we create (or reuse across tasks)."""

        def __init__(self, subdomain: str, driver: Any, make_driver):
            super().__init__(index=0, subdomain=subdomain, headless=True)
            self.subdomain, self.driver_in, self.make_driver = subdomain, driver, make_driver

        def create_driver(self):
            self.driver = self.driver_in or self.make_driver(self.window_width, self.window_height)
            self.driver.get(self.url)
            self.driver.find_element("id", self.SYNC_SCREEN_ID)  # implicit wait: page is up
            self.inner_width, self.inner_height = self.driver.execute_script(
                "return [window.innerWidth, window.innerHeight];")

        def begin_task(self, seed=None):
            self.driver.execute_script(f"core.EPISODE_MAX_TIME = {_NO_LIMIT_MS};")
            super().begin_task(seed)

    return Instance


class MiniWoBEnv:
    """One Chromium running MiniWoB++ tasks (implements `envs.types.Env`)."""

    def __init__(self, spec: MiniWoBSlots):
        self.spec = spec
        self.instance = None
        self.driver = None
        self.done = False
        self.state: dict = {"done": False, "reason": None}

    # ---- Env ---------------------------------------------------------------------------

    def reset(self, task: Task) -> Observation:
        if task.name not in task_names():
            raise TaskError(f"unknown MiniWoB++ task {task.name!r}")
        if self.instance is None or self.instance.subdomain != task.name:
            self.instance = _instance_class()(task.name, self.driver, self._make_driver)
            self.instance.create_driver()
            self.driver = self.instance.driver
        self.instance.force_stop()
        self.instance.begin_task(seed=task.seed)
        self.done = False
        return self._observe()

    def step(self, action: Action) -> StepResult:
        if self.instance is None:
            raise RuntimeError("step before reset")
        if action.kind in ("finished", "call_user"):
            self.done = True
        elif not self.done and not self.state["done"]:  # the page ends episodes only on input
            self._perform(action)
            if self.spec.settle_ms:
                time.sleep(self.spec.settle_ms / 1000)
        obs = self._observe()
        return StepResult(obs, self.done or self.state["done"], {"reason": self.state["reason"]})

    def evaluate(self) -> float:
        meta = self.instance.get_metadata()
        return min(max(float(meta["raw_reward"]), 0.0), 1.0) if meta["done"] else 0.0

    def close(self) -> None:
        if self.driver is not None:
            try:
                self.driver.quit()
            finally:
                self.kill()

    def kill(self) -> None:
        """Kill chromedriver and every browser process (their own process group)."""
        driver, self.driver, self.instance = self.driver, None, None
        process = getattr(getattr(driver, "service", None), "process", None)
        if process is not None:
            process_groups.kill(process, timeout_s=10)
            reaper.forget(process.pid)

    def browser_pids(self) -> list[int]:
        """The browser's processes (tests kill them to simulate crashes)."""
        pgid = self.driver.service.process.pid
        return [pid for pid in process_groups.group_pids(pgid) if pid != pgid]

    # ---- browser -----------------------------------------------------------------------

    def _make_driver(self, window_width: int, window_height: int):
        options = webdriver.ChromeOptions()
        for arg in self.spec.chrome_args:
            if self.spec.headless or not arg.startswith("--headless"):
                options.add_argument(arg)
        # headless=new counts browser chrome in the window: leave room below the task
        options.add_argument(f"--window-size={window_width},{window_height + 200}")
        options.binary_location = self.spec.chrome_binary
        service = Service(self.spec.chromedriver, popen_kw={"start_new_session": True})
        driver = webdriver.Chrome(service=service, options=options)
        reaper.watch(service.process.pid)  # the browser dies with this server, however it dies
        driver.implicitly_wait(5)
        return driver

    def _observe(self) -> Observation:
        inst = self.instance
        png = self.driver.get_screenshot_as_png()
        image = Image.open(io.BytesIO(png))
        scale = image.width / inst.inner_width
        image = image.crop((0, 0, round(inst.task_width * scale), round(inst.task_height * scale)))
        if scale != 1:
            image = image.resize((inst.task_width, inst.task_height))
        buf = io.BytesIO()
        image.convert("RGB").save(buf, "PNG", compress_level=1)
        self.state = self.driver.execute_script(_STATE_JS)  # one round trip for the rest
        utterance = self.state["utterance"]
        if isinstance(utterance, dict):
            utterance = utterance["utterance"]
        lines: list[str] = []
        _flatten(self.state["dom"], "", lines)
        return Observation(buf.getvalue(), inst.task_width, inst.task_height, str(utterance), "\n".join(lines))

    def _perform(self, action: Action) -> None:
        chain = ActionChains(self.driver, duration=0)
        pointer, keys = chain.w3c_actions.pointer_action, chain.w3c_actions.key_action
        if action.kind in ("click", "left_double", "right_single", "drag"):
            pointer.move_to_location(*_px(action.point))
            if action.kind == "click":
                pointer.click()
            elif action.kind == "left_double":
                pointer.double_click()
            elif action.kind == "right_single":
                pointer.context_click()
            else:
                pointer.click_and_hold()
                (x0, y0), (x1, y1) = action.point, action.end_point
                for t in (0.25, 0.5, 0.75, 1.0):
                    pointer.move_to_location(*_px((x0 + (x1 - x0) * t, y0 + (y1 - y0) * t)))
                pointer.release()
        elif action.kind == "scroll":
            x, y = _px(action.point or (self.instance.task_width / 2, self.instance.task_height / 2))
            d = self.spec.scroll_px * (1 if action.direction in ("down", "right") else -1)
            horizontal = action.direction in ("left", "right")
            chain.w3c_actions.wheel_action.scroll(x=x, y=y, delta_x=d if horizontal else 0,
                                                  delta_y=0 if horizontal else d)
        elif action.kind == "hotkey":
            pressed = [_KEYS.get(k, k) for k in action.keys]
            for key in pressed:
                keys.key_down(key)
            for key in reversed(pressed):
                keys.key_up(key)
        elif action.kind == "type":
            for char in action.content:
                key = Keys.ENTER if char == "\n" else char
                keys.key_down(key)
                keys.key_up(key)
        elif action.kind == "wait":
            time.sleep(_WAIT_S)
            return
        chain.w3c_actions.perform()


def _px(point) -> tuple[int, int]:
    return int(round(point[0])), int(round(point[1]))


def _flatten(node: dict | None, parent_text: str, lines: list[str]) -> None:
    """getDOMInfo's tree as envs.dom lines; a checkbox or radio is labelled by its <label>."""
    if node is None:
        return
    tag = str(node.get("tag", "")).lower()
    children = node.get("children") or []
    text = node.get("text")
    if text is None:  # an element with children: its own text is its direct text nodes
        text = " ".join(str(c.get("text", "")) for c in children if c.get("tag") == "t")
    value = node.get("value", "")
    checked = value is True
    if isinstance(value, bool):
        value, text = "", text or parent_text
    lines.append(dom.format_element(int(node.get("ref", 0)), tag, str(text),
                                    (node["left"], node["top"], node["width"], node["height"]),
                                    value=str(value or ""), checked=checked,
                                    focused=bool(node.get("focused")), id=str(node.get("id") or ""),
                                    classes=str(node.get("classes") or "") if isinstance(node.get("classes"), str) else ""))
    for child in children:
        if child.get("tag") != "t":
            _flatten(child, str(text), lines)
