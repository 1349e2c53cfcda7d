"""Shared pieces: an env server on background threads, an oracle episode runner, a fake
OSWorld in-VM server (a real HTTP server on 127.0.0.1 answering like the VM's), and the
session's desktop VM server (marker `vm`)."""

import asyncio
import contextlib
import dataclasses
import io
import json
import shutil
import threading
from collections.abc import AsyncIterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psutil
import pytest
from PIL import Image

from dart_jax.wire import WireConfig
from dart_jax.wire.messages import TaskSpec
from envs import oracle
from dart_jax.wire.env_client import EnvClient, EnvSession
from envs.config import EnvServerConfig, OSWorldSlots, QemuSettings
from envs.server import serving
from envs.types import Observation


def server_config(*slots, max_message_bytes: int = 1 << 28, **kwargs) -> EnvServerConfig:
    wire = WireConfig(endpoint="tcp://127.0.0.1:0", timeout_s=30.0, max_message_bytes=max_message_bytes)
    return EnvServerConfig(wire=wire, slots=slots, **kwargs)


def spec(backend: str, name: str, seed: int = 0, config: dict | None = None) -> TaskSpec:
    return TaskSpec(task_id=f"{backend}/{name}/{seed}", backend=backend, name=name, seed=seed,
                    config=json.dumps(config) if config else "")


def observation(reply) -> Observation:
    o = reply.observation
    return Observation(o.screenshot, o.width, o.height, o.instruction, o.dom_text)


async def oracle_episode(env: EnvSession, task: TaskSpec, max_steps: int = 20):
    """Reset, let the oracle act through the wire until done, evaluate."""
    reply, history = await env.reset(task), []
    for _ in range(max_steps):
        if reply.done or reply.status == "env_error":
            break
        history.append(oracle.act(task.backend, task.name, observation(reply), history))
        reply = await env.step(history[-1])
    return await env.evaluate()


def run(coro):
    return asyncio.run(coro)


@pytest.fixture
def env_server():
    """`env_server(*slot_specs, **cfg)` -> (EnvServer, endpoint); stopped after the test."""
    stack = []

    def start(*slots, **kwargs):
        ctx = serving(server_config(*slots, **kwargs))
        envs, wire = ctx.__enter__()
        stack.append(ctx)
        return envs, wire.endpoint

    yield start
    for ctx in reversed(stack):
        ctx.__exit__(None, None, None)


def client(endpoint: str, **kwargs) -> EnvClient:
    return EnvClient(WireConfig(endpoint=endpoint, timeout_s=30.0), **kwargs)


@contextlib.asynccontextmanager
async def desktop_env(endpoint: str) -> AsyncIterator:
    """One `osworld` slot of a VM server, leased with a desktop VM's step and reset timeouts;
    the client closed after."""
    c = client(endpoint, step_timeout_s=150.0, reset_timeout_s=450.0)
    try:
        yield await c.acquire("osworld")
    finally:
        await c.aclose()


class FakeVM:
    """What OSWorld's in-VM server answers: /screenshot, /accessibility, /execute (its
    output: the next of `outputs` while there are any, else empty)."""

    def __init__(self, size=(1920, 1080)):
        buf = io.BytesIO()
        Image.new("RGB", size, "navy").save(buf, "PNG")
        self.png, self.commands, self.outputs = buf.getvalue(), [], []
        vm = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                if self.path == "/screenshot":
                    self._send(200, vm.png, "image/png")
                elif self.path == "/accessibility":
                    self._send(200, json.dumps({"AT": "<desktop-frame/>"}).encode(), "application/json")
                else:
                    self._send(404, b"not found", "text/plain")

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path in ("/execute", "/setup/execute"):
                    vm.commands.append(body["command"])
                    output = vm.outputs.pop(0) if vm.outputs else ""
                    self._send(200, json.dumps({"status": "success", "output": output, "error": ""}).encode(),
                               "application/json")
                else:
                    self._send(404, b"not found", "text/plain")

            def _send(self, code, data, kind):
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def fake_vm():
    vm = FakeVM()
    yield vm
    vm.close()


INFEASIBLE_TASK = {"id": "infeasible-demo", "instruction": "Set the screen to 16K resolution.",
                   "config": [], "evaluator": {"func": "infeasible"}}


# ---- desktop VMs (marker `vm`) --------------------------------------------------------------

def pytest_collection_modifyitems(config, items):
    """Tests marked `vm` need QEMU (`make setup-vm` installs it and builds the image); with
    QEMU present and the image missing they fail and say so, rather than skip. Tests marked
    `osworld_image` boot the `osworld` image, which `make test` does not build
    (`make setup-vm-osworld`): skipped where it is not built. Tests marked `osworld_eval`
    need desktop-env's environment, which `make test` does not make (6.6 GB)."""
    from envs.osworld import image
    from envs.osworld.sidecar import VENV
    qemu, sidecar = shutil.which("qemu-system-x86_64"), (VENV / "bin" / "python").is_file()
    osworld_image = (image.cache_root() / f"osworld-{image.source_key('osworld')}" / "manifest.json").is_file()
    for item in items:
        if item.get_closest_marker("vm") is not None and not qemu:
            item.add_marker(pytest.mark.skip(reason="needs qemu-system-x86_64 (make setup-vm installs it)"))
        if item.get_closest_marker("osworld_image") is not None and not osworld_image:
            item.add_marker(pytest.mark.skip(reason="needs the osworld VM image (make setup-vm-osworld, "
                                                    "not built by make test)"))
        if item.get_closest_marker("osworld_eval") is not None and not sidecar:
            item.add_marker(pytest.mark.skip(reason=f"needs {VENV.name} (make setup-osworld-eval: desktop-env, "
                                                    "6.6 GB, not made by make test)"))


def vm_slots(count: int = 1, **qemu) -> OSWorldSlots:
    """Desktop VM slots as the tests run them: software emulation where KVM cannot boot
    (accel auto probes), a 1280x800 screen, the window list in every observation, and 30 s
    for any answer of the VM (a hung one is replaced after that; a step takes 2-10 s)."""
    return OSWorldSlots(provider="qemu", count=count, screen_width=1280, screen_height=800, settle_s=1.0,
                        observe_windows=True, http_timeout_s=30.0, qemu=QemuSettings(**{"memory_mib": 1024, **qemu}))


@pytest.fixture(scope="session")
def vm_server():
    """One env server with one desktop VM slot, shared by every `vm` test of the session
    (booting takes a minute or two under TCG). Closing it must leave no QEMU behind."""
    yield from _serving_vms(vm_slots())


@pytest.fixture(scope="session")
def osworld_vm_server():
    """The same with one VM of the `osworld` image (marker `osworld_image`), its guest sized
    for one of OSWorld's applications at a time (docs/desktop-vms.md), 10 s for the screen to
    settle after an action (LibreOffice's dialogs take 10-30 s to open under TCG here), and
    OSWorld's evaluators in a sidecar (started only by a task that asks for them)."""
    from envs.osworld.sidecar import VENV
    yield from _serving_vms(dataclasses.replace(vm_slots(image="osworld", memory_mib=OSWORLD_GUEST_MIB),
                                                settle_s=10.0, eval_sidecar=str(VENV / "bin" / "python")))


OSWORLD_GUEST_MIB = 2048


def _serving_vms(slots: OSWorldSlots):
    ctx = serving(server_config(slots, reset_timeout_s=400.0, step_timeout_s=120.0))
    envs, wire = ctx.__enter__()
    try:
        yield envs, wire.endpoint
    finally:
        pids = [slot.env.machine.process.pid for slot in envs.slots
                if slot.env is not None and slot.env.machine is not None and slot.env.machine.alive()]
        ctx.__exit__(None, None, None)
        left = [pid for pid in pids if alive(pid)]
        assert not left, f"QEMU processes outlived their slots: {left}"


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie waiting for init to reap it has ended)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
