"""Env server throughput: steps/s and mean slot utilization.

    python -m benchmarks.components.env_server [--seconds 20]

For each configuration (MiniWoB++ with 1, 2 and 4 slots; synthetic with 16 slots) the env
server runs as its own process and this process drives one asyncio client with one
session per slot. Each session plays episodes of at most 10 random UI-TARS actions
(clicks, typing, scrolls, hotkeys; sent as model text, parsed by the server), resetting to
the next task/seed when an episode ends. After a warm-up episode per slot the server's
counters are reset, then the window runs `--seconds`. steps_per_s = EnvStep replies in the
window / window length; mean_slot_utilization = mean over slots of the time inside backend
calls / window (EnvStats). Prints one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import random
import tempfile
import time

from dart_jax.wire import WireConfig
from dart_jax.wire.messages import TaskSpec
from dart_jax.wire.env_client import EnvClient, EnvSession
from envs.actions import DEFAULT_SPACE
from envs.config import EnvServerConfig, MiniWoBSlots, SyntheticSlots
from envs.server import serving

MINIWOB_TASKS = ("click-button", "click-checkboxes", "enter-text", "focus-text", "click-test-2",
                 "choose-list", "click-dialog", "login-user")
SYNTHETIC_TASKS = ("click-button", "enter-text", "check-boxes", "select-item", "form")
MAX_STEPS = 10


def _serve(cfg: EnvServerConfig, ready, stop) -> None:
    with serving(cfg):
        ready.set()
        stop.wait()


def _random_action(rng: random.Random, width: int, height: int) -> str:
    mw, mh = DEFAULT_SPACE.model_size(width, height)
    point = f"'({rng.randint(0, mw)},{rng.randint(0, mh)})'"
    roll = rng.random()
    if roll < 0.6:
        call = f"click(start_box={point})"
    elif roll < 0.75:
        call = f"type(content='{rng.choice(['hello', 'abc', 'Submit'])}')"
    elif roll < 0.9:
        call = f"scroll(start_box={point}, direction='{rng.choice(['up', 'down'])}')"
    else:
        call = f"hotkey(key='{rng.choice(['ctrl a', 'tab', 'backspace'])}')"
    return f"Thought: explore.\nAction: {call}"


async def _player(session: EnvSession, backend: str, tasks, seed: int, until: list[float]) -> None:
    rng, episode = random.Random(seed), 0
    while time.monotonic() < until[0]:
        name = tasks[(seed + episode) % len(tasks)]
        reply = await session.reset(TaskSpec(task_id=f"{backend}/{name}/{episode}", backend=backend,
                                             name=name, seed=seed * 1000 + episode))
        for _ in range(MAX_STEPS):
            if reply.done or time.monotonic() >= until[0]:
                break
            obs = reply.observation
            reply = await session.step(_random_action(rng, obs.width, obs.height))
        episode += 1


async def _drive(endpoint: str, backend: str, tasks, slots: int, seconds: float) -> dict:
    client = EnvClient(WireConfig(endpoint=endpoint, timeout_s=120))
    sessions = [await client.acquire(backend, wait_s=120) for _ in range(slots)]
    warm = [time.monotonic() + 1e9]
    await asyncio.gather(*(s.reset(TaskSpec(task_id="warm", backend=backend, name=tasks[0]))
                           for s in sessions))
    await client.stats(reset=True)
    start = time.monotonic()
    warm[0] = start + seconds
    await asyncio.gather(*(_player(s, backend, tasks, i, warm) for i, s in enumerate(sessions)))
    stats = await client.stats()
    elapsed = time.monotonic() - start
    await client.aclose()
    steps = sum(s.steps for s in stats.slots)
    return {"backend": backend, "slots": slots, "seconds": round(elapsed, 2), "steps": steps,
            "episodes": sum(s.episodes for s in stats.slots), "steps_per_s": round(steps / elapsed, 1),
            "mean_slot_utilization": round(sum(s.utilization for s in stats.slots) / slots, 3),
            "env_errors": sum(s.env_errors for s in stats.slots)}


def bench(spec, tasks, seconds: float) -> dict:
    endpoint = f"ipc://{tempfile.gettempdir()}/dart-env-bench-{os.getpid()}-{spec.type}-{spec.count}"
    cfg = EnvServerConfig(wire=WireConfig(endpoint=endpoint), slots=(spec,))
    ctx = mp.get_context("spawn")
    ready, stop = ctx.Event(), ctx.Event()
    server = ctx.Process(target=_serve, args=(cfg, ready, stop))
    server.start()
    try:
        if not ready.wait(120):
            raise RuntimeError("the env server did not start")
        return asyncio.run(_drive(endpoint, spec.type, tasks, spec.count, seconds))
    finally:
        stop.set()
        server.join(60)
        if server.is_alive():
            server.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="measurement window per configuration")
    args = parser.parse_args()
    runs = [bench(MiniWoBSlots(count=n), MINIWOB_TASKS, args.seconds) for n in (1, 2, 4)]
    runs.append(bench(SyntheticSlots(count=16), SYNTHETIC_TASKS, args.seconds))
    print(json.dumps({"cpus": os.cpu_count(), "max_steps_per_episode": MAX_STEPS, "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
