"""Scripted experts for the bundled desktop tasks (envs/osworld/tasks), merged into
`envs.oracle.SOLVERS` under backend "osworld".

The observation's element text lists the desktop's windows (`observe_windows`); each
task's progress shows in window titles (an editor's "*" and file name, a dialog, a
shell's working directory), so the expert needs no memory of its own.
"""

from __future__ import annotations

from typing import Callable

from envs.dom import Element
from envs.types import Action, Observation


def _give_up(why: str) -> Action:
    return Action(kind="call_user", thought=why)


def _windows(elements: list[Element]) -> list[Element]:
    return [e for e in elements if e.role == "window"]


def _vm_mousepad_save_as(instruction, elements, obs):
    windows = _windows(elements)
    dialogs = [w for w in windows if w.label == "Save As"]
    editor = next((w for w in windows if w.label.endswith(" - Mousepad")), None)
    if editor is None:
        return _give_up("The text editor is not open.")
    title = editor.label[:-len(" - Mousepad")]
    named = title.lstrip("*").endswith("agenda.txt")
    # a second save sent while a slow dialog was still opening leaves a dialog too many
    if dialogs and ((named and not title.startswith("*")) or len(dialogs) > 1):
        return Action(kind="hotkey", keys=("esc",), thought="Close the extra save dialog.")
    if dialogs:
        return Action(kind="type", content="/home/user/Documents/agenda.txt\n",
                      thought="Name the file by its full path and confirm.")
    if title == "Untitled 1":
        return Action(kind="type", content="meeting at 10", thought='Type "meeting at 10" into the editor.')
    if named:
        if title.startswith("*"):
            return Action(kind="hotkey", keys=("ctrl", "s"), thought="Save the changes.")
        return Action(kind="finished", thought="The line is written and saved as agenda.txt.")
    # unsaved, or saved under another name (a dialog that was not ready took the default)
    return Action(kind="hotkey", keys=("ctrl", "shift", "s"), thought="Save it under the name asked for.")


def _vm_xterm_mkdir(instruction, elements, obs):
    shell = next((w for w in _windows(elements) if w.label.startswith("user@dart-vm: ")), None)
    if shell is None:
        return _give_up("No terminal is open.")
    if shell.label.endswith(": ~/reports"):
        return Action(kind="finished", thought="The shell is inside the new reports folder.")
    return Action(kind="type", content="mkdir -p ~/reports && cd ~/reports\n",
                  thought="Create the folder and change into it.")


def _vm_infeasible(instruction, elements, obs):
    return Action(kind="call_user", thought="No screen can show 16K here: the task is infeasible.")


SOLVERS: dict[str, Callable[[str, list[Element], Observation], Action]] = {
    "mousepad-save-as": _vm_mousepad_save_as,
    "xterm-mkdir": _vm_xterm_mkdir,
    "os-infeasible-16k": _vm_infeasible,
}
