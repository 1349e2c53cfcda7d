"""OSWorld's own evaluator, run in desktop-env's environment (`.venv-osworld-eval`).

    .venv-osworld-eval/bin/python envs/osworld/sidecar_main.py

Started by envs/osworld/sidecar.py as a child of the env server; it imports only the
standard library and desktop-env (which cannot be installed beside the trainer's pins), so
it runs by path, not as part of the `envs` package. The protocol, one JSON object per line:
it writes `{"ready": true}` once desktop-env is imported, then answers each request

    {"example": {...OSWorld task...}, "vm": "http://127.0.0.1:PORT", "last_action": "DONE",
     "cache_dir": "/tmp/...", "screen": [1280, 800], "ports": {"chromium": 9222, "vlc": 8080}}

with `{"score": <number>}` or `{"error": "<text>"}`: desktop-env's `DesktopEnv.evaluate`
(the evaluator's postconfig, then its getters and metrics) against the VM at `vm`, whose
browser's DevTools and VLC's HTTP interface answer on the host of `vm` at `ports` (QEMU
forwards them to other loopback ports; OSWorld's 9222 and 8080 when absent).
Requests are read up to MAX_REQUEST_BYTES a line. desktop-env prints to stdout, so the
replies go to a private copy of stdout and stdout itself is pointed at stderr.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from urllib.parse import urlsplit

MAX_REQUEST_BYTES = 8 << 20


def remote_desktop_env(url: str, screen: tuple[int, int], cache_dir: str, os_type: str = "Ubuntu",
                       snapshot_name: str = "init_state", accessibility_tree: bool = False,
                       chromium_port: int = 9222, vlc_port: int = 8080):
    """A DesktopEnv bound to a running VM at `url`, without a provider: the attributes
    `DesktopEnv._start_emulator` would set (desktop-env 1.0.2)."""
    from desktop_env.controllers.python import PythonController
    from desktop_env.controllers.setup import SetupController
    from desktop_env.desktop_env import DesktopEnv

    parts = urlsplit(url)
    host, port = parts.hostname, parts.port or 5000
    width, height = screen
    env = DesktopEnv.__new__(DesktopEnv)
    env.__dict__.update(
        region=None, provider_name="remote", enable_proxy=False, client_password="password",
        screen_width=width, screen_height=height, server_port=port,
        chromium_port=chromium_port, vnc_port=8006, vlc_port=vlc_port, current_use_proxy=False, manager=None,
        provider=None, os_type=os_type, is_environment_used=False, path_to_vm=url,
        snapshot_name=snapshot_name, cache_dir_base=cache_dir, headless=True,
        require_a11y_tree=accessibility_tree, require_terminal=False, instruction=None,
        action_space="pyautogui", _traj_no=-1, _step_no=0, action_history=[], vm_ip=host,
        controller=PythonController(vm_ip=host, server_port=port),
        setup_controller=SetupController(vm_ip=host, server_port=port, chromium_port=chromium_port, vlc_port=vlc_port,
                                         cache_dir=cache_dir, client_password="password",
                                         screen_width=width, screen_height=height))
    return env


def evaluate(request: dict) -> float:
    cache_dir = request.get("cache_dir") or tempfile.mkdtemp(prefix="osworld-eval-")
    ports = request.get("ports") or {}
    env = remote_desktop_env(request["vm"], tuple(request["screen"]), cache_dir,
                             chromium_port=int(ports.get("chromium", 9222)), vlc_port=int(ports.get("vlc", 8080)))
    env._set_task_info(request["example"])
    last = request.get("last_action")
    env.action_history = [last] if last else []
    return float(env.evaluate())


def main() -> None:
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # desktop-env's prints land on stderr, never in a reply
    import desktop_env.desktop_env  # noqa: F401  (the seconds it takes, before "ready")
    replies.write(json.dumps({"ready": True}) + "\n")
    while line := sys.stdin.buffer.readline(MAX_REQUEST_BYTES + 1):
        if len(line) > MAX_REQUEST_BYTES:
            replies.write(json.dumps({"error": f"request over {MAX_REQUEST_BYTES} bytes"}) + "\n")
            while line and not line.endswith(b"\n"):  # the rest of that line
                line = sys.stdin.buffer.readline(MAX_REQUEST_BYTES)
            continue
        try:
            reply = {"score": evaluate(json.loads(line))}
        except Exception as e:  # the evaluator's own failure, told to the env server
            reply = {"error": f"{type(e).__name__}: {e}"[:2000]}
        replies.write(json.dumps(reply) + "\n")


if __name__ == "__main__":
    main()
