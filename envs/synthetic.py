"""A synthetic GUI suite drawn with PIL: fast, deterministic by seed, no browser.

Tasks (difficulty 1-3 adds distractors and makes the page taller than the screen, so
targets must be scrolled to):

- click-button:  click the button with the given label.
- click-color:   click the square of the named color (colored tiles in a shuffled grid:
                 grounding by color, which a small vision tower learns quickly).
- enter-text:    type a word into a text field, then press Submit.
- check-boxes:   tick exactly the named checkboxes, then Submit.
- select-item:   click the named entry of a long list.
- form:          two pages: a name field and Next, then a plan choice and Submit.

Widgets are screen rectangles below a fixed header holding the instruction. The
observation's `dom_text` lists every widget, one line each, in the format
`envs.dom.format_element` writes (the oracle reads it). A step takes a few ms, plus the
configured latency (`Latency`: fixed or heavy-tailed, as slow real environments are).
"""

from __future__ import annotations

import dataclasses
import io
import math
import random
import time

from PIL import Image, ImageDraw, ImageFont

from envs import dom
from envs.config import Latency
from envs.types import Action, Observation, StepResult, Task, TaskError

TASKS = ("click-button", "click-color", "enter-text", "check-boxes", "select-item", "form")
HEADER = 40
WORDS = ("apple", "river", "cloud", "tiger", "maple", "stone", "piano", "ocean", "lemon", "ember",
         "frost", "orbit", "cedar", "pearl", "delta", "quartz", "nova", "sable", "tulip", "zephyr")
PLANS = ("Basic", "Pro", "Team", "Enterprise")
COLORS = {"Red": (220, 50, 47), "Green": (40, 170, 60), "Blue": (38, 110, 220), "Yellow": (240, 200, 30),
          "Purple": (140, 70, 190), "Orange": (245, 130, 30)}


@dataclasses.dataclass
class Widget:
    ref: int
    role: str  # button | textbox | checkbox | listitem
    label: str
    x: int
    y: int  # page coordinate (below the header, before scrolling)
    w: int
    h: int
    page: int = 0
    value: str = ""
    checked: bool = False
    fill: tuple[int, int, int] | None = None  # a colored tile (click-color)


@dataclasses.dataclass
class Scenario:
    instruction: str
    widgets: list[Widget]
    goal: dict  # what success means, per task
    page_height: int


def delay(lat: Latency, rng: random.Random) -> float:
    """One draw of the latency, in seconds."""
    if lat.kind == "none":
        return 0.0
    z = rng.gauss(0.0, 1.0) if lat.kind == "lognormal" else 0.0
    return min(lat.median_s * math.exp(lat.sigma * z), lat.max_s)


class SyntheticEnv:
    """One synthetic GUI (implements `envs.types.Env`)."""

    def __init__(self, width: int = 400, height: int = 300, difficulty: int = 1,
                 latency: Latency = Latency(), slot: int = 0):
        if not 1 <= difficulty <= 3:
            raise ValueError(f"difficulty must be 1, 2 or 3, got {difficulty}")
        self.size, self.difficulty = (width, height), difficulty
        self.font = ImageFont.load_default(size=12)
        self.task: Task | None = None
        self.latency = latency
        self._delays = random.Random(f"{latency.seed}:{slot}")

    def _wait(self) -> None:
        """Take as long as the configured latency says (OSWorld-like step times)."""
        if self.latency.kind != "none":
            time.sleep(delay(self.latency, self._delays))

    def reset(self, task: Task) -> Observation:
        if task.name not in TASKS:
            raise TaskError(f"unknown synthetic task {task.name!r} (known: {', '.join(TASKS)})")
        difficulty = int(task.config.get("difficulty", self.difficulty))
        layout = Layout(self.size[0], _x_span(task, self.size[0]), WORDS[:_vocabulary(task)])
        rng = random.Random(f"{task.name}:{difficulty}:{task.seed}")
        try:
            scene = _GENERATORS[task.name](rng, difficulty, layout)
        except ValueError as e:  # more distinct labels asked for than the vocabulary holds
            raise TaskError(f"task {task.id}: {e}") from None
        self.task, self.scene = task, scene
        self.page, self.scroll, self.focus, self.done, self.success = 0, 0, None, False, False
        self.select_all = False
        self._wait()
        return self.observe()

    def step(self, action: Action) -> StepResult:
        if self.task is None:
            raise RuntimeError("step before reset")
        if not self.done:
            self._apply(action)
        self._wait()
        return StepResult(self.observe(), self.done, {"success": self.success})

    def evaluate(self) -> float:
        self._wait()
        return 1.0 if self.success else 0.0

    def close(self) -> None:
        self.task = None

    # ---- dynamics ----------------------------------------------------------------------

    def _apply(self, action: Action) -> None:
        if action.kind in ("click", "left_double"):
            self._click(self._hit(action.point))
        elif action.kind == "type" and self.focus is not None:
            text = action.content
            self.focus.value = ("" if self.select_all else self.focus.value) + text.rstrip("\n")
            self.select_all = False
            if text.endswith("\n"):
                self._press(next(w for w in self._widgets() if w.role == "button"))
        elif action.kind == "hotkey":
            self._hotkey(action.keys)
        elif action.kind == "scroll" and action.direction in ("up", "down"):
            step = (self.size[1] - HEADER) * 3 // 4 * (1 if action.direction == "down" else -1)
            self.scroll = min(max(self.scroll + step, 0), self._max_scroll())
        elif action.kind in ("finished", "call_user"):
            self.done = True

    def _click(self, widget: Widget | None) -> None:
        self.focus = widget if widget is not None and widget.role == "textbox" else None
        self.select_all = False
        if widget is None:
            return
        if widget.role == "checkbox":
            if self.scene.goal.get("exclusive"):
                for w in self._widgets():
                    w.checked = w.checked and w.role != "checkbox"
            widget.checked = not widget.checked
        elif widget.role in ("button", "listitem"):
            self._press(widget)

    def _press(self, widget: Widget) -> None:
        goal, name = self.scene.goal, self.task.name
        if widget.label == "Next":
            self.page, self.scroll, self.focus = self.page + 1, 0, None
            return
        if name in ("click-button", "click-color", "select-item"):
            self.success = widget.label == goal["label"]
        else:  # a Submit button: compare the whole state with the goal
            values = {w.label: w.value for w in self.scene.widgets if w.role == "textbox"}
            checked = {w.label for w in self.scene.widgets if w.role == "checkbox" and w.checked}
            self.success = values == goal.get("values", {}) and checked == goal.get("checked", set())
        self.done = True

    def _hotkey(self, keys: tuple[str, ...]) -> None:
        if self.focus is not None and keys == ("ctrl", "a"):
            self.select_all = True
        elif self.focus is not None and keys == ("backspace",):
            self.focus.value = "" if self.select_all else self.focus.value[:-1]
            self.select_all = False
        elif keys == ("enter",) and self.focus is not None:
            self._press(next(w for w in self._widgets() if w.role == "button"))

    def _widgets(self) -> list[Widget]:
        return [w for w in self.scene.widgets if w.page == self.page]

    def _max_scroll(self) -> int:
        return max(0, self.scene.page_height - (self.size[1] - HEADER))

    def _hit(self, point) -> Widget | None:
        x, y = point
        for w in self._widgets():
            sy = w.y + HEADER - self.scroll
            if w.x <= x < w.x + w.w and max(sy, HEADER) <= y < sy + w.h:
                return w
        return None

    # ---- rendering ---------------------------------------------------------------------

    def observe(self) -> Observation:
        width, height = self.size
        image = Image.new("RGB", self.size, "white")
        draw = ImageDraw.Draw(image)
        lines = []
        for w in self._widgets():
            sy = w.y + HEADER - self.scroll
            lines.append(dom.format_element(w.ref, w.role, w.label, (w.x, sy, w.w, w.h), value=w.value,
                                            checked=w.checked, focused=w is self.focus))
            if sy + w.h > HEADER and sy < height:
                self._draw(draw, w, sy)
        draw.rectangle((0, 0, width, HEADER - 1), fill=(255, 255, 204))
        draw.multiline_text((4, 4), _wrap(self.scene.instruction, 60), fill="black", font=self.font)
        if self._max_scroll():
            top = HEADER + (height - HEADER) * self.scroll // self.scene.page_height
            draw.rectangle((width - 5, top, width - 1, top + 20), fill=(160, 160, 160))
        buf = io.BytesIO()
        image.save(buf, "PNG", compress_level=1)
        return Observation(buf.getvalue(), width, height, self.scene.instruction, "\n".join(lines))

    def _draw(self, draw: ImageDraw.ImageDraw, w: Widget, sy: int) -> None:
        box = (w.x, sy, w.x + w.w - 1, sy + w.h - 1)
        if w.fill is not None:
            draw.rectangle(box, fill=w.fill)
            draw.text((w.x + 6, sy + 5), w.label, fill="white", font=self.font)
        elif w.role == "button":
            draw.rounded_rectangle(box, radius=4, fill=(66, 133, 244))
            draw.text((w.x + 6, sy + 5), w.label, fill="white", font=self.font)
        elif w.role == "textbox":
            draw.rectangle(box, outline=(0, 90, 200) if w is self.focus else (120, 120, 120), width=2)
            draw.text((w.x + 4, sy + 5), w.value or w.label, font=self.font,
                      fill="black" if w.value else (160, 160, 160))
        elif w.role == "checkbox":
            draw.rectangle((w.x, sy + 3, w.x + 13, sy + 16), outline="black", width=1)
            if w.checked:
                draw.line((w.x + 2, sy + 9, w.x + 6, sy + 14, w.x + 12, sy + 4), fill="black", width=2)
            draw.text((w.x + 20, sy + 3), w.label, fill="black", font=self.font)
        else:
            draw.rectangle(box, outline=(200, 200, 200))
            draw.text((w.x + 6, sy + 4), w.label, fill="black", font=self.font)


def _vocabulary(task: Task) -> int:
    """`config.words`: how many of WORDS the task draws its words and labels from (all by
    default; fewer makes the word a choice among a few rather than a copy of any)."""
    return _int_setting(task, "words", len(WORDS), 1, len(WORDS))


def _x_span(task: Task, width: int) -> int:
    """`config.x_span`: how far apart, in pixels, the left edges of a column's widgets may be
    drawn (the whole screen's width by default; less makes where a widget lies more alike
    from seed to seed, so a click that ignores the screen hits more often)."""
    return _int_setting(task, "x_span", width - 180, 0, width - 180)


def _int_setting(task: Task, key: str, default: int, lo: int, hi: int) -> int:
    value = task.config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise TaskError(f"task {task.id}: config.{key} must be an integer in {lo}..{hi}, got {value!r}")
    return value


def _wrap(text: str, width: int) -> str:
    lines, line = [], ""
    for word in text.split():
        if line and len(line) + len(word) >= width:
            lines.append(line)
            line = ""
        line = f"{line} {word}".strip()
    return "\n".join([*lines, line][:2])


# ---- task generators: (rng, difficulty, layout) -> Scenario ----------------------------------------

@dataclasses.dataclass(frozen=True)
class Layout:
    """What a generator draws on: the screen's width, the horizontal span of a column's left
    edges, and the vocabulary of words and labels."""
    width: int
    x_span: int
    words: tuple[str, ...]


def _column(rng: random.Random, labels, role: str, difficulty: int, x_span: int, h: int = 24,
            gap: int = 10, start: int = 10, page: int = 0, ref0: int = 1) -> list[Widget]:
    """Widgets stacked down the page, each at a random x; harder levels spread them over more
    than a screen."""
    spread = (0, 20, 60)[difficulty - 1]
    y, widgets = start, []
    for i, label in enumerate(labels):
        x = 10 + rng.randint(0, x_span)
        widgets.append(Widget(ref0 + i, role, label, x, y, 150, h, page=page))
        y += h + gap + rng.randint(0, spread)
    return widgets


def _page_height(widgets: list[Widget]) -> int:
    return max(w.y + w.h for w in widgets) + 10


def _gen_click_button(rng, difficulty, layout) -> Scenario:
    labels = rng.sample(layout.words, 1 + 2 * difficulty)
    widgets = _column(rng, [w.capitalize() for w in labels], "button", difficulty, layout.x_span)
    target = rng.choice(widgets).label
    return Scenario(f'Click the "{target}" button.', widgets, {"label": target}, _page_height(widgets))


def _gen_click_color(rng, difficulty, layout) -> Scenario:
    """Tiles of 2 + 2 * difficulty colors in a shuffled two-column grid filling the page."""
    names = list(COLORS)[:2 + 2 * difficulty]
    rng.shuffle(names)
    rows, tile_w = (len(names) + 1) // 2, (layout.width - 30) // 2
    tile_h = (250 - 10 * (rows + 1)) // rows
    widgets = [Widget(i + 1, "button", name, 10 + (i % 2) * (tile_w + 10), 10 + (i // 2) * (tile_h + 10),
                      tile_w, tile_h, fill=COLORS[name]) for i, name in enumerate(names)]
    target = rng.choice(names)
    return Scenario(f'Click the "{target}" square.', widgets, {"label": target}, _page_height(widgets))


def _gen_enter_text(rng, difficulty, layout) -> Scenario:
    word, fields = rng.choice(layout.words), rng.sample(("Name", "City", "Email", "Code"), difficulty)
    widgets = _column(rng, fields, "textbox", difficulty, layout.x_span)
    widgets += _column(rng, ["Submit"], "button", 1, layout.x_span, start=_page_height(widgets), ref0=10)
    target = rng.choice(fields)
    values = {f: (word if f == target else "") for f in fields}
    return Scenario(f'Type "{word}" into the "{target}" field and press Submit.', widgets,
                    {"values": values}, _page_height(widgets))


def _gen_check_boxes(rng, difficulty, layout) -> Scenario:
    labels = rng.sample(layout.words, 2 + 2 * difficulty)
    wanted = set(rng.sample(labels, rng.randint(1, len(labels) - 1)))
    widgets = _column(rng, labels, "checkbox", difficulty, layout.x_span, h=20, gap=6)
    widgets += _column(rng, ["Submit"], "button", 1, layout.x_span, start=_page_height(widgets), ref0=20)
    names = ", ".join(f'"{w}"' for w in labels if w in wanted)
    return Scenario(f"Select {names} and press Submit.", widgets, {"checked": wanted},
                    _page_height(widgets))


def _gen_select_item(rng, difficulty, layout) -> Scenario:
    labels = rng.sample(layout.words, 4 + 4 * difficulty)
    widgets = [Widget(i + 1, "listitem", label, 20, 10 + 22 * i, 200, 22) for i, label in enumerate(labels)]
    target = rng.choice(labels)
    return Scenario(f'Select "{target}" from the list.', widgets, {"label": target}, _page_height(widgets))


def _gen_form(rng, difficulty, layout) -> Scenario:
    name, plan = rng.choice(layout.words).capitalize(), rng.choice(PLANS[:1 + difficulty])
    widgets = [Widget(1, "textbox", "Name", 20, 20, 200, 24), Widget(2, "button", "Next", 20, 60, 80, 24)]
    widgets += _column(rng, PLANS[:1 + difficulty], "checkbox", 1, layout.x_span, h=20, gap=6, page=1, ref0=3)
    widgets += _column(rng, ["Submit"], "button", 1, layout.x_span, start=_page_height(widgets), page=1, ref0=9)
    return Scenario(f'Sign up with the name "{name}" and the plan "{plan}", then submit.', widgets,
                    {"values": {"Name": name}, "checked": {plan}, "exclusive": True},
                    _page_height(widgets))


_GENERATORS = {"click-button": _gen_click_button, "click-color": _gen_click_color, "enter-text": _gen_enter_text,
               "check-boxes": _gen_check_boxes, "select-item": _gen_select_item, "form": _gen_form}
