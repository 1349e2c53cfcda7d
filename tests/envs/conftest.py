"""Shared pieces: an env server on background threads, an oracle episode runner, and a
fake OSWorld in-VM server (a real HTTP server on 127.0.0.1 answering like the VM's)."""

import asyncio
import io
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from PIL import Image

from dart_jax.wire import WireConfig
from dart_jax.wire.messages import TaskSpec
from envs import oracle
from dart_jax.wire.env_client import EnvClient, EnvSession
from envs.config import EnvServerConfig
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
    reply = await env.reset(task)
    for _ in range(max_steps):
        if reply.done or reply.status == "env_error":
            break
        reply = await env.step(oracle.act(task.backend, task.name, observation(reply)))
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


class FakeVM:
    """What OSWorld's in-VM server answers: /screenshot, /accessibility, /execute."""

    def __init__(self, size=(1920, 1080)):
        buf = io.BytesIO()
        Image.new("RGB", size, "navy").save(buf, "PNG")
        self.png, self.commands = buf.getvalue(), []
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
                if self.path == "/execute":
                    vm.commands.append(body["command"])
                    self._send(200, json.dumps({"status": "success", "output": "", "error": ""}).encode(),
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
