"""The in-VM server of OSWorld's protocol, for the Debian desktop image (runs inside the
guest as the desktop user, with the guest's Python 3 and Debian's python3-flask,
python3-xlib, python3-pil, python3-pyatspi, and pyautogui).

Routes and payloads follow OSWorld's desktop_env/server/main.py, so its clients
(PythonController, SetupController, the getters) and ours (envs.osworld.VMClient) work
unchanged: GET /screenshot (PNG, the X server's cursor in it), GET /accessibility ({"AT": xml}),
GET /terminal, GET /platform, GET /cursor_position, POST /execute and /setup/execute
({"command", "shell"} -> {"status", "output", "error", "returncode"}), POST /setup/launch,
/setup/open_file, /setup/activate_window, /setup/close_window, /setup/upload (multipart
file_path + file_data), /setup/execute_with_verification, POST /file (form file_path),
/list_directory, /screen_size, /window_size, /desktop_path, /run_python, /run_bash_script.
What this desktop has not (network downloads, GNOME wallpaper, recording) answers 501.

`python -c CODE` commands (every pyautogui action arrives as one) run in a child forked
from a warm interpreter that has pyautogui imported already: the same process semantics
(own process, captured output, exit code) without the 1-3 s interpreter start and import
that dominate a step under software emulation.
"""

import argparse
import ctypes
import functools
import io
import json
import logging
import os
import shlex
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import xml.etree.ElementTree as ET
from pathlib import Path

from flask import Flask, jsonify, request, send_file

app = Flask(__name__)
COMMAND_TIMEOUT_S = 120
A11Y_DEADLINE_S = 30.0
A11Y_MAX_DEPTH, A11Y_MAX_WIDTH = 50, 1024
NS = {"st": "https://accessibility.ubuntu.example.org/ns/state",
      "attr": "https://accessibility.ubuntu.example.org/ns/attributes",
      "cp": "https://accessibility.ubuntu.example.org/ns/component",
      "txt": "https://accessibility.ubuntu.example.org/ns/text",
      "val": "https://accessibility.ubuntu.example.org/ns/value",
      "act": "https://accessibility.ubuntu.example.org/ns/action"}
for _prefix, _uri in NS.items():
    ET.register_namespace(_prefix, _uri)


# ---- commands ---------------------------------------------------------------------------

def _expand(command, shell):
    if isinstance(command, str) and not shell:
        command = shlex.split(command)
    if isinstance(command, list):
        command = [os.path.expanduser(a) if isinstance(a, str) and a.startswith("~/") else a for a in command]
    return command


def _python_code(command):
    """The CODE of a `python -c CODE` command (no further arguments), else None."""
    if isinstance(command, list) and len(command) == 3 and command[1] == "-c" and \
            os.path.basename(command[0]) in ("python", "python3"):
        return command[2]
    return None


def run_command(command, shell=False, timeout=COMMAND_TIMEOUT_S):
    """(stdout, stderr, returncode) of a command, Python snippets in a warm fork."""
    command = _expand(command, shell)
    code = _python_code(command)
    if code is not None:
        return _run_forked(code, timeout)
    result = subprocess.run(command, shell=shell, capture_output=True, text=True, timeout=timeout)
    return result.stdout, result.stderr, result.returncode


def _run_forked(code, timeout):
    """`python -c code` in a child of this process, which has pyautogui imported."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        pid = os.fork()
        if pid == 0:  # the child: never returns into the server
            try:
                os.setsid()
                _own_display()
                os.dup2(out.fileno(), 1)
                os.dup2(err.fileno(), 2)
                sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", closefd=False), line_buffering=True)
                sys.stderr = io.TextIOWrapper(os.fdopen(2, "wb", closefd=False), line_buffering=True)
                status = 0
                try:
                    exec(compile(code, "<string>", "exec"), {"__name__": "__main__"})
                except SystemExit as e:
                    status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
                except BaseException:
                    traceback.print_exc()
                    status = 1
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(locals().get("status", 1))
        status = _wait(pid, timeout)
        out.seek(0)
        err.seek(0)
        return out.read().decode(errors="replace"), err.read().decode(errors="replace"), status


def _own_display():
    """The child's own X connection: the one pyautogui opened at import is the parent's
    socket, and two processes writing requests into one connection corrupt it."""
    from pyautogui import _pyautogui_x11
    from Xlib.display import Display
    _pyautogui_x11._display = Display(os.environ["DISPLAY"])


def _pointer_and_size():
    """((x, y), (width, height)) on a connection of this request's own."""
    from Xlib.display import Display
    d = Display(os.environ["DISPLAY"])
    try:
        screen = d.screen()
        pointer = screen.root.query_pointer()
        return (pointer.root_x, pointer.root_y), (screen.width_in_pixels, screen.height_in_pixels)
    finally:
        d.close()


def _wait(pid, timeout):
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise subprocess.TimeoutExpired(["python", "-c"], timeout)
        time.sleep(0.005)


@app.route("/setup/execute", methods=["POST"])
@app.route("/execute", methods=["POST"])
def execute():
    data = request.get_json(force=True)
    shell = bool(data.get("shell", False))
    try:
        out, err, code = run_command(data.get("command", "" if shell else []), shell)
    except Exception as e:
        return jsonify({"status": "error", "message": str(e)}), 500
    return jsonify({"status": "success", "output": out, "error": err, "returncode": code})


@app.route("/setup/execute_with_verification", methods=["POST"])
@app.route("/execute_with_verification", methods=["POST"])
def execute_with_verification():
    data = request.get_json(force=True)
    shell = bool(data.get("shell", False))
    verification = data.get("verification") or {}
    try:
        out, err, code = run_command(data.get("command", "" if shell else []), shell)
    except Exception as e:
        return jsonify({"status": "error", "message": str(e)}), 500
    reply = {"output": out, "error": err, "returncode": code}
    start = time.monotonic()
    while verification:
        if _verified(verification):
            return jsonify({**reply, "status": "success", "verification": "passed",
                            "wait_time": time.monotonic() - start})
        if time.monotonic() - start > float(data.get("max_wait_time", 10)):
            return jsonify({**reply, "status": "verification_failed", "verification": "failed"}), 500
        time.sleep(float(data.get("check_interval", 1)))
    return jsonify({**reply, "status": "success"})


def _verified(verification):
    if "window_exists" in verification and \
            verification["window_exists"].lower() not in _windows_text().lower():
        return False
    if "command_success" in verification:
        check = subprocess.run(verification["command_success"], shell=True, capture_output=True, timeout=5)
        return check.returncode == 0
    return True


@app.route("/setup/launch", methods=["POST"])
def launch():
    data = request.get_json(force=True)
    shell = bool(data.get("shell", False))
    command = _expand(data.get("command", "" if shell else []), shell)
    try:
        subprocess.Popen(command, shell=shell, start_new_session=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except Exception as e:
        return jsonify({"status": "error", "message": str(e)}), 500
    return f"{command if shell else ' '.join(command)} launched successfully"


@app.route("/run_python", methods=["POST"])
def run_python():
    code = (request.get_json(force=True) or {}).get("code")
    if not code:
        return jsonify({"status": "error", "message": "Code not supplied!"}), 400
    try:
        out, err, rc = _run_forked(code, 30)
    except subprocess.TimeoutExpired:
        return jsonify({"status": "error", "message": "Execution timeout", "error": "TimeoutExpired",
                        "output": None}), 500
    return jsonify({"status": "success" if rc == 0 else "error", "message": out + err, "output": out,
                    "error": err, "return_code": rc})


@app.route("/run_bash_script", methods=["POST"])
def run_bash_script():
    data = request.get_json(force=True)
    script, workdir = data.get("script"), data.get("working_dir")
    if not script:
        return jsonify({"status": "error", "output": "Script not supplied!", "error": "", "returncode": -1}), 400
    workdir = os.path.expanduser(workdir) if workdir else None
    try:
        result = subprocess.run(["/bin/bash", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, timeout=float(data.get("timeout", 100)), cwd=workdir)
    except (subprocess.TimeoutExpired, OSError) as e:
        return jsonify({"status": "error", "output": str(e), "error": "", "returncode": -1}), 500
    return jsonify({"status": "success" if result.returncode == 0 else "error", "output": result.stdout,
                    "error": "", "returncode": result.returncode})


# ---- the screen -------------------------------------------------------------------------

_ARROW = [(0, 0), (0, 17), (4, 13), (7, 20), (10, 19), (7, 12), (12, 12)]


class _XFixesCursorImage(ctypes.Structure):
    """XFixesCursorImage of <X11/extensions/Xfixes.h> (version 2 and on): each pixel an
    unsigned long holding premultiplied ARGB in its low 32 bits."""
    _fields_ = [("x", ctypes.c_short), ("y", ctypes.c_short), ("width", ctypes.c_ushort),
                ("height", ctypes.c_ushort), ("xhot", ctypes.c_ushort), ("yhot", ctypes.c_ushort),
                ("cursor_serial", ctypes.c_ulong), ("pixels", ctypes.POINTER(ctypes.c_ulong)),
                ("atom", ctypes.c_ulong), ("name", ctypes.c_char_p)]


_CURSOR_MAX = 256  # a cursor image larger than this on a side is not one (an arrow is drawn)


@functools.lru_cache(maxsize=1)
def _xfixes():
    """(libX11, libXfixes) with the signatures `_cursor` calls, or None where either is missing."""
    try:
        x11, xfixes = ctypes.CDLL("libX11.so.6"), ctypes.CDLL("libXfixes.so.3")
    except OSError:
        return None
    x11.XOpenDisplay.restype, x11.XOpenDisplay.argtypes = ctypes.c_void_p, [ctypes.c_char_p]
    x11.XCloseDisplay.argtypes = x11.XFree.argtypes = [ctypes.c_void_p]
    xfixes.XFixesGetCursorImage.restype = ctypes.POINTER(_XFixesCursorImage)
    xfixes.XFixesGetCursorImage.argtypes = [ctypes.c_void_p]
    xfixes.XFixesQueryExtension.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)]
    return x11, xfixes


def _cursor():
    """(RGBA image, top-left x, top-left y) of the cursor the X server shows now (XFixes:
    the shape the application under the pointer set: an arrow, a text beam, a hand), or
    None where libX11/libXfixes or the extension is missing."""
    from PIL import Image
    libs = _xfixes()
    if libs is None:
        return None
    x11, xfixes = libs
    d = x11.XOpenDisplay(os.environ["DISPLAY"].encode())
    if not d:
        return None
    try:
        base, error = ctypes.c_int(), ctypes.c_int()
        if not xfixes.XFixesQueryExtension(d, ctypes.byref(base), ctypes.byref(error)):
            return None
        found = xfixes.XFixesGetCursorImage(d)
        if not found:
            return None
        try:
            c = found.contents
            if not (0 < c.width <= _CURSOR_MAX and 0 < c.height <= _CURSOR_MAX):
                return None
            n = c.width * c.height
            # the low 32 bits of each long, little-endian: B, G, R, premultiplied alpha
            argb = struct.pack(f"<{n}I", *(p & 0xFFFFFFFF for p in c.pixels[:n]))
            return Image.frombytes("RGBA", (c.width, c.height), argb, "raw", "BGRa"), c.x - c.xhot, c.y - c.yhot
        finally:
            x11.XFree(found)
    finally:
        x11.XCloseDisplay(d)


@app.route("/screenshot", methods=["GET"])
def screenshot():
    """The screen as PNG with the pointer in it (Xvfb has no hardware cursor, so the grab
    lacks it): the cursor image the X server shows, from XFixes; a drawn arrow where XFixes
    cannot answer (logged)."""
    from PIL import ImageDraw, ImageGrab
    image = ImageGrab.grab(xdisplay=os.environ["DISPLAY"])
    cursor = _cursor()
    if cursor is not None:
        sprite, left, top = cursor
        image.paste(sprite, (left, top), sprite)
    else:
        logging.warning("no XFixes cursor image: the pointer is drawn as an arrow")
        (x, y), _ = _pointer_and_size()
        ImageDraw.Draw(image).polygon([(x + dx, y + dy) for dx, dy in _ARROW], fill="white", outline="black")
    buf = io.BytesIO()
    image.save(buf, "PNG", compress_level=1)
    buf.seek(0)
    return send_file(buf, mimetype="image/png")


@app.route("/cursor_position", methods=["GET"])
def cursor_position():
    (x, y), _ = _pointer_and_size()
    return jsonify(x, y)


@app.route("/screen_size", methods=["POST"])
def screen_size():
    _, (width, height) = _pointer_and_size()
    return jsonify({"width": width, "height": height})


@app.route("/window_size", methods=["POST"])
def window_size():
    name = request.form.get("app_class_name")
    if not name:
        return jsonify({"error": "app_class_name is required"}), 400
    from Xlib import X, display, error
    d = display.Display()
    root = d.screen().root
    ids = root.get_full_property(d.intern_atom("_NET_CLIENT_LIST"), X.AnyPropertyType)
    for window_id in (ids.value if ids else []):
        try:
            window = d.create_resource_object("window", window_id)
            if name.lower() in [c.lower() for c in (window.get_wm_class() or ())]:
                geometry = window.get_geometry()
                return jsonify({"width": geometry.width, "height": geometry.height})
        except error.XError:
            continue
    return jsonify({"error": f"no window of class {name}"}), 404


@app.route("/platform", methods=["GET"])
def platform_name():
    return "Linux"


@app.route("/terminal", methods=["GET"])
def terminal():
    """gnome-terminal's text, read through AT-SPI as OSWorld reads it: the focused terminal
    of gnome-terminal's active window, trailing blanks stripped; null where no terminal or
    more than one qualifies (xterm, the small image's terminal, has no accessibility)."""
    import pyatspi
    deadline = time.monotonic() + A11Y_DEADLINE_S
    active, focused = f"{{{NS['st']}}}active", f"{{{NS['st']}}}focused"
    found = []
    for application in pyatspi.Registry.getDesktop(0):
        if application is not None and application.name == "gnome-terminal-server":
            tree = _a11y_node(application, 1, deadline)
            for frame in tree.findall("frame"):
                if frame.get(active) == "true":
                    found += [t for t in frame.iter("terminal") if t.get(focused) == "true"]
    output = (found[0].text or "").rstrip() if len(found) == 1 else None
    return jsonify({"output": output, "status": "success"})


# ---- windows ----------------------------------------------------------------------------

def _windows_text():
    return subprocess.run(["wmctrl", "-l"], capture_output=True, text=True).stdout


def _wmctrl(flag, window_name, strict, by_class):
    options = "-" + ("x" if by_class else "") + ("F" if strict else "") + flag
    return subprocess.run(["wmctrl", options, window_name], capture_output=True, text=True).returncode


@app.route("/setup/activate_window", methods=["POST"])
def activate_window():
    data = request.get_json(force=True)
    if not data.get("window_name"):
        return "window_name required", 400
    if _wmctrl("a", data["window_name"], data.get("strict", False), data.get("by_class", False)):
        return f"Window {data['window_name']} not found", 404
    return "Window activated successfully", 200


@app.route("/setup/close_window", methods=["POST"])
def close_window():
    data = request.get_json(force=True)
    if not data.get("window_name"):
        return "window_name required", 400
    if _wmctrl("c", data["window_name"], data.get("strict", False), data.get("by_class", False)):
        return f"Window {data['window_name']} not found", 404
    return "Window closed successfully.", 200


@app.route("/setup/open_file", methods=["POST"])
def open_file():
    data = request.get_json(force=True)
    path = data.get("path")
    if not path:
        return "Path not supplied!", 400
    target = Path(os.path.expandvars(os.path.expanduser(path)))
    if target.exists():
        command, names = ["xdg-open", str(target)], [target.name, target.stem]
    elif subprocess.run(["which", path], capture_output=True).returncode == 0:
        command, names = [path], [path]
    else:
        return f"Application/file not found: {path}", 404
    names = [data["window_name"]] if data.get("window_name") else names
    subprocess.Popen(command, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + float(data.get("timeout_seconds", 1800))
    while time.monotonic() < deadline:
        for line in _windows_text().splitlines():
            if any(name in line for name in names):
                subprocess.run(["wmctrl", "-i", "-a", line.split()[0]])
                return "File opened and window activated successfully"
        time.sleep(0.5)
    return f"Failed to find window for {names}", 500


# ---- files ------------------------------------------------------------------------------

@app.route("/file", methods=["POST"])
def get_file():
    if "file_path" not in request.form:
        return jsonify({"error": "file_path is required"}), 400
    path = os.path.expandvars(os.path.expanduser(request.form["file_path"]))
    if not os.path.isfile(path):
        return jsonify({"error": "File not found"}), 404
    return send_file(path, as_attachment=True)


@app.route("/setup/upload", methods=["POST"])
def upload():
    if "file_path" not in request.form or "file_data" not in request.files:
        return jsonify({"error": "file_path and file_data are required"}), 400
    path = os.path.expandvars(os.path.expanduser(request.form["file_path"]))
    try:
        if os.path.dirname(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
        request.files["file_data"].save(path)
    except OSError as e:
        return jsonify({"error": f"Failed to upload file: {e}"}), 500
    return f"File Uploaded: {os.path.getsize(path)} bytes"


@app.route("/list_directory", methods=["POST"])
def list_directory():
    path = (request.get_json(force=True) or {}).get("path")
    if not path:
        return jsonify(error="Missing 'path' parameter"), 400
    if not os.path.isdir(path):
        return jsonify(error="The provided path is not a directory"), 400
    return jsonify(directory_tree=_tree(path))


def _tree(directory):
    node = {"type": "directory", "name": os.path.basename(directory), "children": []}
    try:
        for entry in sorted(os.listdir(directory)):
            full = os.path.join(directory, entry)
            node["children"].append(_tree(full) if os.path.isdir(full) else {"type": "file", "name": entry})
    except OSError as e:
        return {"error": str(e)}
    return node


@app.route("/desktop_path", methods=["POST"])
def desktop_path():
    path = os.path.join(str(Path.home()), "Desktop")
    if os.path.isdir(path):
        return jsonify(desktop_path=path)
    return jsonify(error="desktop path not found"), 404


@app.route("/setup/download_file", methods=["POST"])
@app.route("/setup/change_wallpaper", methods=["POST"])
@app.route("/wallpaper", methods=["POST"])
@app.route("/start_recording", methods=["POST"])
@app.route("/end_recording", methods=["POST"])
def unsupported():
    # The guest has no network (QEMU's restrict=on), no GNOME settings, no ffmpeg.
    return jsonify({"status": "error", "message": f"{request.path} is not supported by this desktop"}), 501


# ---- accessibility ----------------------------------------------------------------------

@app.route("/accessibility", methods=["GET"])
def accessibility():
    import pyatspi
    deadline = time.monotonic() + A11Y_DEADLINE_S
    root = ET.Element("desktop-frame")
    for application in pyatspi.Registry.getDesktop(0):
        if application is not None and time.monotonic() < deadline:
            root.append(_a11y_node(application, 1, deadline))
    return jsonify({"AT": ET.tostring(root, encoding="unicode")})


def _a11y_node(node, depth, deadline):
    import pyatspi
    attrs = {"name": node.name or ""}
    states = node.getState()
    for state in states.get_states():
        name = pyatspi.StateType._enum_lookup[state].split("_", 1)[1].lower()
        attrs[f"{{{NS['st']}}}{name}"] = "true"
    for key, value in (node.get_attributes() or {}).items():
        if key:
            attrs[f"{{{NS['attr']}}}{key}"] = value
    if states.contains(pyatspi.STATE_VISIBLE) and states.contains(pyatspi.STATE_SHOWING):
        try:
            x, y, w, h = node.queryComponent().getExtents(pyatspi.XY_SCREEN)
            attrs[f"{{{NS['cp']}}}screencoord"] = f"({x}, {y})"
            attrs[f"{{{NS['cp']}}}size"] = f"({w}, {h})"
        except NotImplementedError:
            pass
    text = ""
    try:
        t = node.queryText()
        text = t.getText(0, t.characterCount).replace("\ufffc", "").replace("\ufffd", "")
    except NotImplementedError:
        pass
    try:
        v = node.queryValue()
        attrs[f"{{{NS['val']}}}value"] = str(v.currentValue)
    except NotImplementedError:
        pass
    role = (node.getRoleName() or "unknown").strip().replace(" ", "-") or "unknown"
    element = ET.Element(role, attrs)
    if text:
        element.text = text
    if depth < A11Y_MAX_DEPTH:
        for i, child in enumerate(node):
            if i == A11Y_MAX_WIDTH or time.monotonic() > deadline:
                break
            if child is not None:
                element.append(_a11y_node(child, depth + 1, deadline))
    return element


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=5000)
    args = parser.parse_args()
    import pyautogui  # noqa: F401  (imported once here: every forked command finds it loaded)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request on the console
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    threading.current_thread().name = "osworld-server"
    app.run(host="0.0.0.0", port=args.port, threaded=True)


if __name__ == "__main__":
    main()
