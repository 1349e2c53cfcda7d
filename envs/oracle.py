"""Scripted experts that read the instruction and `dom_text` and answer in model text.

    text = oracle.act(task.backend, task.name, observation, history)   # "Thought: ...\nAction: ..."

They drive tests (the full server/client path must solve tasks), and their texts are
demonstrations for the experience pool: each answer is an `Action` rendered by
`envs.actions.render`, the exact format the policy must learn. `history` is the episode's
earlier answers, as the policy's prompt shows them: a desktop's dialog looks the same before
and after a name typed into it that the application was not ready to take, and only what the
expert did tells the two apart. An oracle that meets a state it cannot handle answers
`call_user()` (gives up).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Callable

from envs import dom
from envs.actions import parse, render
from envs.dom import Element
from envs.osworld import oracle as desktop_oracle
from envs.synthetic import HEADER
from envs.types import Action, Observation

Solver = Callable[[str, list[Element], Observation, list[Action]], Action]  # history: the episode's actions so far


def act(backend: str, task_name: str, obs: Observation, history: Sequence[str] = ()) -> str:
    """The expert's next step for `obs`, after the episode's earlier answers `history` (model
    text, oldest first), as UI-TARS-1.5 text."""
    solver = SOLVERS.get((backend, task_name))
    if solver is None:
        raise KeyError(f"no oracle for {backend}/{task_name}")
    screen = (obs.width, obs.height)
    action = solver(obs.instruction, dom.parse(obs.dom_text), obs, [parse(text, screen) for text in history])
    return render(action, screen)


def supported() -> list[tuple[str, str]]:
    return sorted(SOLVERS)


def _quoted(text: str) -> list[str]:
    return re.findall(r'"([^"]*)"', text)


def _find(elements: list[Element], role: str, label: str | None = None) -> Element | None:
    return next((e for e in elements if e.role == role and (label is None or e.label == label)), None)


def _click(e: Element, why: str) -> Action:
    return Action(kind="click", point=e.center, thought=why)


def _give_up(why: str) -> Action:
    return Action(kind="call_user", thought=why)


def _type_into(e: Element, text: str) -> Action | None:
    """The next step to make text box `e` hold exactly `text`, or None when it does."""
    if e.value == text:
        return None
    if not e.focused:
        return _click(e, f'Focus the "{e.label or "text"}" field.')
    if e.value:
        return Action(kind="hotkey", keys=("ctrl", "a"), thought="Select the wrong text to replace it.")
    return Action(kind="type", content=text, thought=f'Type "{text}".')


# ---- synthetic -----------------------------------------------------------------------------

def _visible(e: Element, obs: Observation) -> Action | None:
    """A scroll towards `e` when it is not fully on screen (below the header)."""
    x, y, w, h = e.box
    if y < HEADER:
        return Action(kind="scroll", point=(obs.width / 2, obs.height / 2), direction="up",
                      thought=f'"{e.label}" is above; scroll up.')
    if y + h > obs.height:
        return Action(kind="scroll", point=(obs.width / 2, obs.height / 2), direction="down",
                      thought=f'"{e.label}" is below; scroll down.')
    return None


def _press(e: Element | None, obs: Observation, why: str) -> Action:
    if e is None:
        return _give_up("The element I need is missing.")
    return _visible(e, obs) or _click(e, why)


def _syn_click_button(instruction, elements, obs, history):
    (label,) = _quoted(instruction)[:1]
    return _press(_find(elements, "button", label), obs, f'Click the "{label}" button.')


def _syn_click_color(instruction, elements, obs, history):
    (label,) = _quoted(instruction)[:1]
    return _press(_find(elements, "button", label), obs, f'Click the "{label}" square.')


def _syn_select_item(instruction, elements, obs, history):
    (label,) = _quoted(instruction)[:1]
    return _press(_find(elements, "listitem", label), obs, f'Select "{label}".')


def _syn_enter_text(instruction, elements, obs, history):
    word, field = _quoted(instruction)[:2]
    box = _find(elements, "textbox", field)
    if box is None:
        return _give_up("The text field is missing.")
    step = _visible(box, obs) or _type_into(box, word)
    return step or _press(_find(elements, "button", "Submit"), obs, "Submit the form.")


def _syn_check_boxes(instruction, elements, obs, history):
    wanted = set(_quoted(instruction))
    for box in (e for e in elements if e.role == "checkbox"):
        if box.checked != (box.label in wanted):
            return _press(box, obs, f'Toggle "{box.label}".')
    return _press(_find(elements, "button", "Submit"), obs, "Submit the selection.")


def _syn_form(instruction, elements, obs, history):
    name, plan = _quoted(instruction)[:2]
    box = _find(elements, "textbox", "Name")
    if box is not None:
        step = _visible(box, obs) or _type_into(box, name)
        return step or _press(_find(elements, "button", "Next"), obs, "Go to the next page.")
    choice = _find(elements, "checkbox", plan)
    if choice is not None and not choice.checked:
        return _press(choice, obs, f'Choose the "{plan}" plan.')
    return _press(_find(elements, "button", "Submit"), obs, "Submit the form.")


# ---- MiniWoB++ -----------------------------------------------------------------------------

def _mw_click_button(instruction, elements, obs, history):
    (label,) = _quoted(instruction)[:1] or [""]
    button = _find(elements, "button", label)
    return _click(button, f'Click "{label}".') if button else _give_up("No such button.")


def _mw_click_test(instruction, elements, obs, history):
    button = _find(elements, "button")
    return _click(button, "Click the button.") if button else _give_up("No button.")


def _mw_click_test_2(instruction, elements, obs, history):
    match = re.search(r"button (\w+)", instruction)
    button = _find(elements, "button", match.group(1)) if match else None
    if button is None:
        return _give_up("No such button.")
    others = [e.box for e in elements if e.role == "button" and e is not button]
    return Action(kind="click", point=_uncovered(button.box, others), thought=f"Click button {button.label}.")


def _uncovered(box, others) -> tuple[float, float]:
    """The point of `box` nearest its center that no other box covers (buttons overlap)."""
    x, y, w, h = box
    grid = [(x + w * i / 8, y + h * j / 8) for i in range(1, 8) for j in range(1, 8)]
    free = [p for p in grid if not any(ox <= p[0] <= ox + ow and oy <= p[1] <= oy + oh
                                       for ox, oy, ow, oh in others)]
    center = (x + w / 2, y + h / 2)
    return min(free or [center], key=lambda p: (p[0] - center[0]) ** 2 + (p[1] - center[1]) ** 2)


def _mw_enter_text(instruction, elements, obs, history):
    (word,) = _quoted(instruction)[:1] or [""]
    box = _find(elements, "input_text")
    if box is None:
        return _give_up("No text field.")
    step = _type_into(box, word)
    submit = _find(elements, "button", "Submit")
    return step or (_click(submit, "Submit.") if submit else _give_up("No Submit button."))


def _mw_focus_text(instruction, elements, obs, history):
    box = _find(elements, "input_text")
    return _click(box, "Click into the text box.") if box else _give_up("No text box.")


def _mw_click_checkboxes(instruction, elements, obs, history):
    match = re.search(r"Select (.*) and click Submit", instruction)
    if match is None:
        return _give_up("Cannot read the instruction.")
    words = match.group(1).strip()
    wanted = set() if words == "nothing" else {w.strip() for w in words.split(",")}
    for box in (e for e in elements if e.role == "input_checkbox"):
        if box.checked != (box.label in wanted):
            return _click(box, f'Toggle "{box.label}".')
    submit = _find(elements, "button", "Submit")
    return _click(submit, "Submit.") if submit else _give_up("No Submit button.")


SOLVERS: dict[tuple[str, str], Solver] = {
    ("synthetic", "click-button"): _syn_click_button,
    ("synthetic", "click-color"): _syn_click_color,
    ("synthetic", "select-item"): _syn_select_item,
    ("synthetic", "enter-text"): _syn_enter_text,
    ("synthetic", "check-boxes"): _syn_check_boxes,
    ("synthetic", "form"): _syn_form,
    ("miniwob", "click-button"): _mw_click_button,
    ("miniwob", "click-test"): _mw_click_test,
    ("miniwob", "click-test-2"): _mw_click_test_2,
    ("miniwob", "enter-text"): _mw_enter_text,
    ("miniwob", "focus-text"): _mw_focus_text,
    ("miniwob", "click-checkboxes"): _mw_click_checkboxes,
    **{("osworld", name): solver for name, solver in desktop_oracle.SOLVERS.items()},
}
