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


def _since(history: list[Action], opener: tuple[str, ...]) -> list[Action]:
    """The actions after the last `opener` hotkey (all of them where there was none)."""
    for i in range(len(history) - 1, -1, -1):
        if history[i].kind == "hotkey" and history[i].keys == opener:
            return history[i + 1:]
    return history


def _pressed(actions: list[Action], keys: tuple[str, ...]) -> bool:
    return any(a.kind == "hotkey" and a.keys == keys for a in actions)


def _named_in_this_dialog(history: list[Action], path: str, opener: tuple[str, ...]) -> bool:
    """Whether `path` was typed since the last `opener` hotkey (the one that opens the dialog)."""
    return any(a.kind == "type" and a.content.rstrip("\n") == path for a in _since(history, opener))


def _name_the_file(history: list[Action], path: str, opener: tuple[str, ...]) -> Action:
    """In a focused save dialog: type `path` and confirm; where it was typed already, confirm
    again. Under TCG a GTK save dialog can leave its Save button insensitive for a second or
    more after the name changes and ignore that Enter: typing the name again would append it
    to the first ("...agenda.txt/home/user/...")."""
    if _named_in_this_dialog(history, path, opener):
        return Action(kind="hotkey", keys=("enter",), thought="The dialog has the name; confirm it.")
    return Action(kind="type", content=path + "\n", thought="Name the file by its full path and confirm.")


SAVE_AS = ("ctrl", "shift", "s")


def _vm_mousepad_save_as(instruction, elements, obs, history):
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
        return _name_the_file(history, "/home/user/Documents/agenda.txt", SAVE_AS)
    if title == "Untitled 1":
        return Action(kind="type", content="meeting at 10", thought='Type "meeting at 10" into the editor.')
    if named:
        if title.startswith("*"):
            return Action(kind="hotkey", keys=("ctrl", "s"), thought="Save the changes.")
        return Action(kind="finished", thought="The line is written and saved as agenda.txt.")
    # unsaved, or saved under another name (a dialog that was not ready took the default)
    return Action(kind="hotkey", keys=SAVE_AS, thought="Save it under the name asked for.")


def _shell_into(elements: list[Element], folder: str, command: str, thought: str) -> Action:
    """A terminal task whose command ends by changing into `folder`: done once the terminal's
    title (the shell's working directory) shows it."""
    shell = next((w for w in _windows(elements) if w.label.startswith("user@dart-vm: ")), None)
    if shell is None:
        return _give_up("No terminal is open.")
    if shell.label.endswith(f": {folder}"):
        return Action(kind="finished", thought=f"The command ran; the shell is in {folder}.")
    return Action(kind="type", content=command + "\n", thought=thought)


def _vm_xterm_mkdir(instruction, elements, obs, history):
    return _shell_into(elements, "~/reports", "mkdir -p ~/reports && cd ~/reports",
                       "Create the folder and change into it.")


def _libreoffice_save_as(elements: list[Element], history: list[Action], app: str, path: str) -> Action:
    """Save LibreOffice `app`'s document (Calc, Writer, Impress) as `path` through Save As (its GTK
    dialog is titled "Save"; the type follows the name's extension): a dialog on the way (the
    CSV import's options, Impress' templates, Save As) shows in the window list, the saved name in the
    application's window title."""
    windows = _windows(elements)
    if any(w.label.startswith("Text Import") for w in windows):
        return Action(kind="hotkey", keys=("enter",), thought="Accept the import options.")
    if any(w.label == "Select a Template" for w in windows):
        return Action(kind="hotkey", keys=("esc",), thought="Start from the blank presentation.")
    suffix = f" - LibreOffice {app}"
    document = next((w for w in windows if w.label.endswith(suffix)), None)
    saved = document is not None and document.label[:-len(suffix)] == path.rsplit("/", 1)[-1]
    dialogs = [w for w in windows if w.label in ("Save", "Save As")]
    # the first Save As of a LibreOffice takes 10-30 s to open under TCG: a Save As pressed
    # again meanwhile opens a dialog more once the first is done
    if dialogs and saved:
        return Action(kind="hotkey", keys=("esc",), thought="Close the extra save dialog.")
    if any(w.focused for w in dialogs):
        return _name_the_file(history, path, SAVE_AS)
    if document is None and any(w.label.startswith("LibreOffice") for w in windows):
        return Action(kind="wait", thought="LibreOffice is still loading the document.")  # titled once loaded
    if document is None:
        return _give_up(f"LibreOffice {app} is not open.")
    if saved:
        return Action(kind="finished", thought=f"The document is saved as {path}.")
    if dialogs or not document.focused:
        return Action(kind="wait", thought="A dialog is opening.")
    return Action(kind="hotkey", keys=SAVE_AS, thought="Save it under the name asked for.")


def _vm_calc_csv_to_ods(instruction, elements, obs, history):
    return _libreoffice_save_as(elements, history, "Calc", "/home/user/Documents/scores.ods")


def _vm_writer_txt_to_odt(instruction, elements, obs, history):
    return _libreoffice_save_as(elements, history, "Writer", "/home/user/Documents/letter.odt")


def _vm_impress_new_odp(instruction, elements, obs, history):
    return _libreoffice_save_as(elements, history, "Impress", "/home/user/Documents/talk.odp")


def _vm_os_terminal_move_txt(instruction, elements, obs, history):
    return _shell_into(elements, "~/archive", "mkdir -p ~/archive && mv ~/inbox/*.txt ~/archive/ && cd ~/archive",
                       "Make the archive folder, move the text files into it, change into it.")


def _vm_vlc_play_file(instruction, elements, obs, history):
    """VLC's title is the playing file's name before " - VLC media player"; its Open dialog is
    another window, focused once it is up."""
    windows = _windows(elements)
    player = next((w for w in windows if w.label.endswith("VLC media player")), None)
    if player is None:
        return _give_up("The media player is not open.")
    if player.label == "chime.wav - VLC media player":
        return Action(kind="finished", thought="chime.wav is playing.")
    if any(w.focused for w in windows if w is not player):
        return Action(kind="type", content="/home/user/Music/chime.wav\n", thought="Name the file and open it.")
    if player.label == "VLC media player" and player.focused:
        return Action(kind="hotkey", keys=("ctrl", "o"), thought="Open a file.")
    return Action(kind="wait", thought="The open dialog is on its way.")


EXPORT_AS = ("ctrl", "shift", "e")


def _vm_gimp_png_to_jpg(instruction, elements, obs, history):
    """GIMP's image window is titled "[dot] (imported)-1.0 (...) 64x48 – GIMP" until the
    image is exported, "(exported)" after. Its Export Image dialog selects only the name's
    stem ("dot" of dot.png), so the expert selects the whole name before typing the path;
    the options dialog of the type the name gives ("Export Image as JPEG") exports on Enter.
    Options of another type mean the name did not take: cancel them and that dialog, and
    start over."""
    windows = _windows(elements)
    image = next((w for w in windows if w.label.startswith("[dot] (")), None)
    if image is None:
        return _give_up("The image editor has no picture open.")
    if image.label.startswith("[dot] (exported)"):
        return Action(kind="finished", thought="The picture is exported as dot.jpg.")
    options = next((w for w in windows if w.label.startswith("Export Image as ")), None)
    if options is not None and options.label == "Export Image as JPEG":
        return Action(kind="hotkey", keys=("enter",), thought="Export with the JPEG options as they are.")
    if options is not None:
        return Action(kind="hotkey", keys=("esc",), thought="Not a JPEG: cancel these options.")
    dialog = next((w for w in windows if w.label == "Export Image"), None)
    if dialog is None:
        if image.focused:
            return Action(kind="hotkey", keys=EXPORT_AS, thought="Export the picture under a new name.")
        return Action(kind="wait", thought="A dialog is opening.")
    if not dialog.focused:
        return Action(kind="wait", thought="The export dialog is opening.")
    done = _since(history, EXPORT_AS)
    if any(a.kind == "hotkey" and a.keys == ("esc",) for a in done):
        return Action(kind="hotkey", keys=("esc",), thought="Close this dialog and export again.")
    if any(a.kind == "type" for a in done):
        return Action(kind="hotkey", keys=("enter",), thought="The dialog has the name; confirm it.")
    if any(a.kind == "hotkey" and a.keys == ("ctrl", "a") for a in done):
        return Action(kind="type", content="/home/user/Pictures/dot.jpg\n", thought="Name the file and confirm.")
    return Action(kind="hotkey", keys=("ctrl", "a"), thought="Select the whole name.")


def _vm_multi_terminal_opens_writer(instruction, elements, obs, history):
    """Start Writer on the file from the terminal (once), then save it as Writer's own
    document: the LibreOffice expert's Save As."""
    windows = _windows(elements)
    command = "libreoffice --writer ~/Documents/notes.txt &"
    if not any("LibreOffice" in w.label for w in windows):
        if any(a.kind == "type" and a.content.startswith(command) for a in history):
            return Action(kind="wait", thought="The word processor is starting.")
        if not any(w.label.startswith("user@dart-vm: ") for w in windows):
            return _give_up("No terminal is open.")
        return Action(kind="type", content=command + "\n", thought="Open the notes in the word processor.")
    return _libreoffice_save_as(elements, history, "Writer", "/home/user/Documents/notes.odt")


ADDRESS_BAR = ("ctrl", "l")


def _vm_chrome_open_local_page(instruction, elements, obs, history):
    """Chromium's title is the page's before " - Chromium" ("New Tab" at the start): focus
    the address bar, type the file's URL, and wait for the title; a page still not shown a
    few observations after its URL went in is asked for again."""
    browser = next((w for w in _windows(elements) if w.label.endswith(" - Chromium")), None)
    if browser is None:
        return _give_up("The browser is not open.")
    if browser.label == "Recipes - Chromium":
        return Action(kind="finished", thought="The recipes page is the open tab.")
    done = _since(history, ADDRESS_BAR)
    typed = [i for i, a in enumerate(done) if a.kind == "type"]
    if typed and len(done) - typed[-1] <= 4:
        return Action(kind="wait", thought="The page is loading.")
    if _pressed(history, ADDRESS_BAR) and not typed:
        return Action(kind="type", content="file:///home/user/Documents/recipes.html\n",
                      thought="Go to the page's file URL.")
    return Action(kind="hotkey", keys=ADDRESS_BAR, thought="Focus the address bar.")


NEW_MESSAGE, CLOSE = ("ctrl", "n"), ("ctrl", "w")


def _vm_thunderbird_save_draft(instruction, elements, obs, history):
    """Thunderbird's compose window is titled "Write: <subject> - Thunderbird" and opens with
    the To field focused; Alt+S focuses the subject. Closing it with Ctrl+W asks "Save
    Message" (to the drafts folder), whose default button saves."""
    windows = _windows(elements)
    compose = next((w for w in windows if w.label.startswith("Write: ") and w.label.endswith(" - Thunderbird")), None)
    if any(w.label == "Save Message" for w in windows):
        return Action(kind="hotkey", keys=("enter",), thought="Save the message to the drafts folder.")
    if compose is None:
        if _pressed(history, CLOSE) and _pressed(_since(history, CLOSE), ("enter",)):
            return Action(kind="finished", thought="The message is saved as a draft.")
        if not any(w.label.endswith(" - Mozilla Thunderbird") for w in windows):
            return _give_up("Thunderbird is not open.")
        if _pressed(history, NEW_MESSAGE):
            return Action(kind="wait", thought="The compose window is opening.")
        return Action(kind="hotkey", keys=NEW_MESSAGE, thought="Write a new message.")
    if compose.label == "Write: Picnic on Sunday - Thunderbird":
        if _pressed(history, CLOSE):
            return Action(kind="wait", thought="The save question is on its way.")
        return Action(kind="hotkey", keys=CLOSE, thought="Close the message; Thunderbird asks to save it.")
    if not compose.focused:
        return Action(kind="wait", thought="The compose window is not focused yet.")
    done = _since(history, NEW_MESSAGE)
    if not any(a.kind == "type" and a.content == "friend@example.org" for a in done):
        return Action(kind="type", content="friend@example.org", thought="Address the message.")
    if not _pressed(done, ("alt", "s")):
        return Action(kind="hotkey", keys=("alt", "s"), thought="Go to the subject field.")
    if any(a.kind == "type" for a in _since(done, ("alt", "s"))):
        return Action(kind="wait", thought="The title follows the subject.")
    return Action(kind="type", content="Picnic on Sunday", thought="Write the subject.")


def _vm_infeasible(instruction, elements, obs, history):
    return Action(kind="call_user", thought="No screen can show 16K here: the task is infeasible.")


SOLVERS: dict[str, Callable[[str, list[Element], Observation, list[Action]], Action]] = {
    "mousepad-save-as": _vm_mousepad_save_as,
    "xterm-mkdir": _vm_xterm_mkdir,
    "os-infeasible-16k": _vm_infeasible,
    "calc-csv-to-ods": _vm_calc_csv_to_ods,
    "writer-txt-to-odt": _vm_writer_txt_to_odt,
    "impress-new-odp": _vm_impress_new_odp,
    "os-terminal-move-txt": _vm_os_terminal_move_txt,
    "vlc-play-file": _vm_vlc_play_file,
    "gimp-png-to-jpg": _vm_gimp_png_to_jpg,
    "multi-terminal-opens-writer": _vm_multi_terminal_opens_writer,
    "chrome-open-local-page": _vm_chrome_open_local_page,
    "thunderbird-save-draft": _vm_thunderbird_save_draft,
}
