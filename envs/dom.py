"""The text form of a screen's elements (`Observation.dom_text`), one element a line:

    [7] button "Submit" (12,140,60,24) value="" id="subbtn" checked focused

Coordinates are screen pixels (x, y, width, height); strings are JSON-quoted; trailing
bare words are flags. The env server adds `point="(x,y)"` to each element it sends: the
element's center in the action space (model-image pixels, what `click(start_box=...)`
takes), so a policy that reads the text can click by copying it (`with_points`).
Backends write it with `format_element`; oracles and prompts read it with `parse`.
"""

from __future__ import annotations

import dataclasses
import json
import re

_LINE = re.compile(r'\[(\d+)\] (\S+) ("(?:[^"\\]|\\.)*") \((-?[\d.]+),(-?[\d.]+),(-?[\d.]+),(-?[\d.]+)\)(.*)')
_ATTR = re.compile(r' (\w+)=("(?:[^"\\]|\\.)*")| (\w+)')


@dataclasses.dataclass(frozen=True)
class Element:
    ref: int
    role: str
    label: str
    box: tuple[float, float, float, float]  # x, y, width, height
    value: str = ""
    checked: bool = False
    focused: bool = False
    attrs: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def center(self) -> tuple[float, float]:
        x, y, w, h = self.box
        return x + w / 2, y + h / 2


def format_element(ref: int, role: str, label: str, box, value: str = "", checked: bool = False,
                   focused: bool = False, **attrs: str) -> str:
    x, y, w, h = (round(float(v), 1) for v in box)
    parts = [f"[{ref}] {role} {json.dumps(label, ensure_ascii=False)} ({x:g},{y:g},{w:g},{h:g})"]
    if value:
        parts.append(f"value={json.dumps(value, ensure_ascii=False)}")
    parts += [f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in attrs.items() if v]
    parts += [flag for flag, on in (("checked", checked), ("focused", focused)) if on]
    return " ".join(parts)


def parse(text: str) -> list[Element]:
    """Elements of a `dom_text`; lines in another format are skipped."""
    elements = []
    for line in text.splitlines():
        match = _LINE.fullmatch(line)
        if match is None:
            continue
        ref, role, label, *box, rest = match.groups()
        attrs, flags = {}, set()
        for name, value, flag in _ATTR.findall(rest):
            if flag:
                flags.add(flag)
            else:
                attrs[name] = json.loads(value)
        elements.append(Element(int(ref), role, json.loads(label), tuple(float(v) for v in box),
                                attrs.pop("value", ""), "checked" in flags, "focused" in flags, attrs))
    return elements


def with_points(text: str, to_action_space) -> str:
    """`text` with ` point="(x,y)"` after every element line: `to_action_space(center)`
    (screen pixels -> the action's integer coordinates). Other lines pass unchanged."""
    lines = []
    for line in text.splitlines():
        element = parse(line)
        if element and "point" not in element[0].attrs:
            x, y = to_action_space(element[0].center)
            line = f'{line} point="({x},{y})"'
        lines.append(line)
    return "\n".join(lines)
