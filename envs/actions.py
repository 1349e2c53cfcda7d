"""UI-TARS-1.5 action text <-> `Action`, with the model-image <-> screen coordinate map.

The model sees the screenshot resized by Qwen2.5-VL's `smart_resize` (sides multiples of
28, pixel count clamped) and writes absolute pixel coordinates in that resized image:

    Thought: The OK button is at the bottom.
    Action: click(start_box='<|box_start|>(231,402)<|box_end|>')

`parse` turns such text into an `Action` in screen pixels (x * W / W', y * H / H');
`render` writes an `Action` back as model text (oracle demonstrations), so the two maps
are one pair of functions. Model text is scanned, never evaluated. Anything malformed
raises `ActionParseError`; no other exception escapes `parse` for any input string.

Where the action is: the action part starts at the first `Action:` label followed by a
call `name(`; the text before it is the thought. From there the text is scanned as calls,
quotes and backslash escapes understood, so nothing inside a quoted argument (`Action:`,
parentheses, blank lines) decides where the action starts or how many calls there are. A
quote of the opening kind that the model left unescaped ends the value only where the text
goes on as `, name=`, or as the call's `)` followed by the end, a label or another call.

Several actions in one response: refused. UI-TARS can write several calls in a response
(separated by blank lines, or by new `Action:` labels); here one response is one action,
as the prompt asks ("perform the next action", one `Action:` line). Every call is counted
and the response raises `ActionParseError("N actions in one response (kinds); one action
per step")`, so nothing runs: the env server answers `invalid` (penalised or ending the
episode, by its config) with that reason and an empty canonical action, the trajectory's
step is stored with `valid=False`, and the model's own text stays in its prompt history.
"""

from __future__ import annotations

import dataclasses
import math
import re

from dart_jax.agent.image_processing import smart_resize  # Qwen2-VL's rule (numpy/PIL only)
from envs.types import POINT_KINDS, Action, Point

MAX_TEXT_CHARS = 32_768
MAX_HOTKEY_KEYS = 4


class ActionParseError(ValueError):
    """Model text that is not exactly one valid UI-TARS-1.5 action."""


@dataclasses.dataclass(frozen=True)
class ImageSpace:
    """The model's image resizing (Qwen2.5-VL / UI-TARS-1.5 defaults)."""
    factor: int = 28
    min_pixels: int = 100 * 28 * 28
    max_pixels: int = 16384 * 28 * 28

    def model_size(self, width: int, height: int) -> tuple[int, int]:
        """(W', H'): the size of the image the model sees for a `width` x `height` screen."""
        h, w = smart_resize(height, width, self.factor, self.min_pixels, self.max_pixels)
        return w, h


DEFAULT_SPACE = ImageSpace()


def to_screen(point: Point, screen: tuple[int, int], space: ImageSpace = DEFAULT_SPACE) -> Point:
    """Model-image pixel -> screen pixel (clamped into the screen)."""
    (w, h), (mw, mh) = screen, space.model_size(*screen)
    x, y = point[0] * w / mw, point[1] * h / mh
    return min(max(x, 0.0), w - 1.0), min(max(y, 0.0), h - 1.0)


def to_model(point: Point, screen: tuple[int, int], space: ImageSpace = DEFAULT_SPACE) -> tuple[int, int]:
    """Screen pixel -> nearest model-image pixel."""
    (w, h), (mw, mh) = screen, space.model_size(*screen)
    return round(point[0] * mw / w), round(point[1] * mh / h)


# ---- parsing -----------------------------------------------------------------------------

_LABEL = "Action:"
_IDENT = r"[A-Za-z_]\w*"
_CALL_START = re.compile(rf"\s*({_IDENT})\s*\(")
_CALL_END = re.compile(r"\s*\)")
_ARG_SEP = re.compile(r"\s*,?")
_SPACE = re.compile(r"\s*")
_ARG_NAME = re.compile(rf"\s*({_IDENT})\s*=\s*")
# An unescaped quote of the opening kind ends a value only where the text goes on as the
# grammar does: the next argument, or the call's `)` followed by the end, a label or a call.
_VALUE_END = re.compile(rf"\s*,\s*{_IDENT}\s*=|\s*\)\s*(?:\Z|{_LABEL}|{_IDENT}\s*\()")
_STRING_STOPS = {q: re.compile(rf"[\\{q}]") for q in "'\""}
_NUM = r"\s*(-?\d+(?:\.\d+)?)\s*"
_POINT = re.compile(rf"\(?{_NUM}[, ]{_NUM}(?:[, ]{_NUM}[, ]{_NUM})?\)?")
_BOX_TOKENS = re.compile(r"<\|box_start\|>|<\|box_end\|>|</?point>|</?bbox>")
_ESCAPES = {"n": "\n", "t": "\t", "'": "'", '"': '"', "\\": "\\"}
_ALIASES = {"point": "start_box", "start_point": "start_box", "end_point": "end_box",
            "hotkey": "key"}
_SIGNATURES: dict[str, tuple[set[str], set[str]]] = {  # kind: (required, optional)
    "click": ({"start_box"}, set()), "left_double": ({"start_box"}, set()),
    "right_single": ({"start_box"}, set()), "drag": ({"start_box", "end_box"}, set()),
    "hotkey": ({"key"}, set()), "type": ({"content"}, set()),
    "scroll": ({"direction"}, {"start_box"}), "wait": (set(), set()),
    "finished": (set(), {"content"}), "call_user": (set(), set()),
}

_NAMED_KEYS = {"enter", "tab", "esc", "space", "backspace", "delete", "insert", "home", "end",
               "pageup", "pagedown", "up", "down", "left", "right", "ctrl", "shift", "alt",
               "meta", *(f"f{i}" for i in range(1, 13))}
_KEY_ALIASES = {"return": "enter", "escape": "esc", "control": "ctrl", "cmd": "meta",
                "command": "meta", "win": "meta", "super": "meta", "del": "delete",
                "arrowup": "up", "arrowdown": "down", "arrowleft": "left", "arrowright": "right",
                "pgup": "pageup", "pgdn": "pagedown", "option": "alt"}
_CHAR_KEYS = set("abcdefghijklmnopqrstuvwxyz0123456789-=[];',./\\`")

Call = tuple[str, dict[str, str]]  # (kind, {argument: value}) as written, before any checks


def parse(text: str, screen: tuple[int, int], space: ImageSpace = DEFAULT_SPACE) -> Action:
    """The action in model `text` with points mapped to a `screen` (width, height)."""
    if not isinstance(text, str):
        raise ActionParseError(f"expected text, got {type(text).__name__}")
    if len(text) > MAX_TEXT_CHARS:
        raise ActionParseError(f"text of {len(text)} chars (limit {MAX_TEXT_CHARS})")
    start = _action_start(text)
    calls = _scan_calls(text, start + len(_LABEL))
    if len(calls) > 1:
        kinds = ", ".join([kind for kind, _ in calls[:4]] + ["..."] * (len(calls) > 4))
        raise ActionParseError(f"{len(calls)} actions in one response ({kinds}); one action per step")
    kind, args = calls[0]
    _check_signature(kind, args)
    return _build(kind, args, _thought(text[:start]), screen, space)


def _action_start(text: str) -> int:
    """The index of the first `Action:` followed by a call `name(` (one the thought's prose
    mentions is not); nothing after it can move it, so arguments never decide it."""
    first = at = text.find(_LABEL)
    if at < 0:
        raise ActionParseError("no 'Action:' in the text")
    while at >= 0:
        if _CALL_START.match(text, at + len(_LABEL)):
            return at
        at = text.find(_LABEL, at + 1)
    raise ActionParseError(f"no call after 'Action:': {_clip(text[first + len(_LABEL):])}")


def _scan_calls(text: str, pos: int) -> list[Call]:
    """Every call from `pos` to the end of `text`; calls are separated by white space and
    an optional `Action:` label. Anything else after a call is an error."""
    calls = []
    while True:
        call, pos = _scan_call(text, pos)
        calls.append(call)
        pos = _SPACE.match(text, pos).end()
        if pos == len(text):
            return calls
        if text.startswith(_LABEL, pos):
            pos += len(_LABEL)


def _scan_call(text: str, pos: int) -> tuple[Call, int]:
    """`name(arg='value', ...)` at `pos` -> ((name, {arg: value}), the index after its `)`)."""
    start = _CALL_START.match(text, pos)
    if start is None:
        raise ActionParseError(f"expected an action call at {_clip(text[pos:])}")
    kind, args, pos = start.group(1), {}, start.end()
    while (close := _CALL_END.match(text, pos)) is None:
        match = _ARG_NAME.match(text, pos)
        if match is None or text[match.end():match.end() + 1] not in ("'", '"'):
            raise ActionParseError(f"expected name='value' at {_clip(text[pos:])}")
        name = _ALIASES.get(match.group(1), match.group(1))
        if name in args:
            raise ActionParseError(f"argument {name!r} given twice")
        args[name], pos = _scan_string(text, match.end())
        pos = _ARG_SEP.match(text, pos).end()  # a value ends only before `, name=` or `)`
    return (kind, args), close.end()


def _scan_string(text: str, start: int) -> tuple[str, int]:
    """The quoted value opening at `start` -> (its text, the index after its closing quote).
    Backslash escapes the next character; an unescaped opening-kind quote ends the value
    only before `_VALUE_END`, else it is text (models often leave quotes unescaped)."""
    quote, out, pos = text[start], [], start + 1
    while (stop := _STRING_STOPS[quote].search(text, pos)) is not None:
        at = stop.start()
        out.append(text[pos:at])
        if text[at] == "\\":
            pair = text[at + 1:at + 2]
            out.append(_ESCAPES.get(pair, "\\" + pair))
            pos = at + 2
        elif _VALUE_END.match(text, at + 1):
            return "".join(out), at + 1
        else:
            out.append(quote)
            pos = at + 1
    raise ActionParseError(f"unterminated string at {_clip(text[start:])}")


def _check_signature(kind: str, args: dict[str, str]) -> None:
    if kind not in _SIGNATURES:
        raise ActionParseError(f"unknown action {kind!r}")
    required, optional = _SIGNATURES[kind]
    if missing := required - args.keys():
        raise ActionParseError(f"{kind} needs {sorted(missing)}")
    if extra := args.keys() - required - optional:
        raise ActionParseError(f"{kind} takes no {sorted(extra)}")


def _build(kind: str, args: dict[str, str], thought: str, screen: tuple[int, int],
           space: ImageSpace) -> Action:
    point = lambda name: _point(args[name], screen, space) if name in args else None  # noqa: E731
    fields: dict = {"kind": kind, "thought": thought, "point": point("start_box"),
                    "end_point": point("end_box")}
    if kind == "hotkey":
        fields["keys"] = _keys(args["key"])
    elif kind in ("type", "finished"):
        fields["content"] = args.get("content", "")
    elif kind == "scroll":
        if args["direction"].strip() not in ("up", "down", "left", "right"):
            raise ActionParseError(f"bad scroll direction {_clip(args['direction'])}")
        fields["direction"] = args["direction"].strip()
    return Action(**fields)


def _point(value: str, screen: tuple[int, int], space: ImageSpace) -> Point:
    match = _POINT.fullmatch(_BOX_TOKENS.sub("", value).strip()) if len(value) <= 100 else None
    if match is None:
        raise ActionParseError(f"bad point {_clip(value)}")
    nums = [float(g) for g in match.groups() if g is not None]
    x, y = (nums[0], nums[1]) if len(nums) == 2 else ((nums[0] + nums[2]) / 2, (nums[1] + nums[3]) / 2)
    try:
        mw, mh = space.model_size(*screen)
    except (ValueError, ZeroDivisionError) as e:
        raise ActionParseError(f"screen {screen} cannot be mapped: {e}") from None
    if not (math.isfinite(x) and math.isfinite(y) and 0 <= x <= mw and 0 <= y <= mh):
        raise ActionParseError(f"point ({x:g},{y:g}) outside the {mw}x{mh} image")
    return to_screen((x, y), screen, space)


def _keys(value: str) -> tuple[str, ...]:
    keys = tuple(_KEY_ALIASES.get(k, k) for k in re.split(r"[\s+]+", value.strip().lower()) if k)
    if not keys or len(keys) > MAX_HOTKEY_KEYS:
        raise ActionParseError(f"hotkey needs 1-{MAX_HOTKEY_KEYS} keys, got {_clip(value)}")
    for key in keys:
        if key not in _NAMED_KEYS and key not in _CHAR_KEYS:
            raise ActionParseError(f"unknown key {_clip(key)}")
    return keys


def _thought(head: str) -> str:
    for label in ("Thought:", "Action_Summary:", "Reflection:"):
        _, sep, rest = head.partition(label)
        if sep:
            return rest.strip()
    return head.strip()


def _clip(text: str, n: int = 60) -> str:
    return repr(text if len(text) <= n else text[:n] + "...")


# ---- rendering ---------------------------------------------------------------------------

def render(action: Action, screen: tuple[int, int], space: ImageSpace = DEFAULT_SPACE,
           box_tokens: bool = True) -> str:
    """The model text for `action` (the inverse of `parse` up to pixel rounding)."""
    return f"Thought: {action.thought}\nAction: {render_call(action, screen, space, box_tokens)}"


def render_call(action: Action, screen: tuple[int, int], space: ImageSpace = DEFAULT_SPACE,
                box_tokens: bool = True) -> str:
    def box(p: Point) -> str:
        x, y = to_model(p, screen, space)
        return f"'<|box_start|>({x},{y})<|box_end|>'" if box_tokens else f"'({x},{y})'"

    args = []
    if action.point is not None and action.kind in POINT_KINDS:
        args.append(f"start_box={box(action.point)}")
    if action.kind == "drag":
        args.append(f"end_box={box(action.end_point)}")
    if action.kind == "hotkey":
        args.append(f"key='{' '.join(action.keys)}'")
    if action.kind == "type" or (action.kind == "finished" and action.content):
        args.append(f"content='{_escape(action.content)}'")
    if action.kind == "scroll":
        args.append(f"direction='{action.direction}'")
    return f"{action.kind}({', '.join(args)})"


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n").replace("\t", "\\t")
