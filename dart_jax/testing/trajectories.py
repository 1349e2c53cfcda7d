"""The tests' and benchmarks' tasks and trajectories, one pool: small synthetic ones for the
data manager (`make_trajectory`, stand-in PNG screenshots), realistic episodes (UI-TARS prompts
over synthetic-env screenshots, `trajectory`) and screenshot-free text episodes of random
lengths (`text_trajectory`)."""

from __future__ import annotations

import io
import struct
import zlib
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image

from dart_jax.wire.messages import Step, TaskSpec, Trajectory
from dart_jax.wire.png import SIGNATURE
from envs.synthetic import TASKS, SyntheticEnv
from envs.types import Task

if TYPE_CHECKING:
    from dart_jax.agent.prompt import PromptBuilder

SIZES = ((400, 300), (280, 210), (320, 320))  # (width, height) of the synthetic screens


def task_specs(n_train: int, n_eval: int = 0, backend: str = "synthetic") -> list[TaskSpec]:
    """`t0..` training tasks, then `e0..` evaluation tasks."""
    return ([TaskSpec(task_id=f"t{i}", backend=backend, name=f"task-{i}", seed=i) for i in range(n_train)]
            + [TaskSpec(task_id=f"e{i}", backend=backend, name=f"eval-{i}", seed=i, split="eval")
               for i in range(n_eval)])


def make_trajectory(traj_id: str = "t1", task_id: str = "t0", *, success: bool = False, steps: int = 3,
                    version: int = 0, screenshot_bytes: int = 256, prompt_len: int = 16,
                    response_len: int = 4, shared_screens: int = 0, source: str = "rollout",
                    status: str | None = None) -> Trajectory:
    """A deterministic trajectory; its screenshots are `stand_in_png`s of `screenshot_bytes`
    bytes (the store reads only their PNG header). Screenshots are unique to the trajectory
    unless `shared_screens` > 0, which draws them from that many contents shared by all
    trajectories (blob dedup)."""
    rng = np.random.default_rng(zlib.crc32(traj_id.encode()))
    shots = [_screen(rng, traj_id, i, screenshot_bytes, shared_screens) for i in range(steps)]
    step_list = [Step(prompt_ids=rng.integers(0, 150_000, prompt_len, dtype=np.int32),
                      response_ids=rng.integers(0, 150_000, response_len, dtype=np.int32),
                      logprobs=-rng.random(response_len, dtype=np.float32),
                      image_refs=list(range(max(0, i - 4), i + 1)), policy_version=version,
                      response_text=f"Thought: step {i}\nAction: click(start_box='(1,2)')",
                      action="click(start_box='(1,2)')") for i in range(steps)]
    return Trajectory(traj_id=traj_id, task_id=task_id, steps=step_list, screenshots=shots,
                      reward=1.0 if success else 0.0,
                      status=status or ("success" if success else "failure"),
                      worker_id="w0", created_at=1.0, source=source)


def _screen(rng: np.random.Generator, traj_id: str, i: int, size: int, shared: int) -> bytes:
    if shared:
        key = zlib.crc32(f"{traj_id}/{i}".encode()) % shared
        return stand_in_png(np.random.default_rng(key), size)
    return stand_in_png(rng, size)


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


_IHDR = _chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0))  # 1x1, 8-bit gray
_IDAT = _chunk(b"IDAT", zlib.compress(b"\x00\x00"))  # filter byte, one black pixel
_IEND = _chunk(b"IEND", b"")
_PNG_OVERHEAD = len(SIGNATURE + _IHDR + _IDAT + _IEND) + 12  # the padding chunk's frame


def stand_in_png(rng: np.random.Generator, size: int) -> bytes:
    """A valid 1x1 PNG of exactly `size` bytes: random bytes in a private ancillary chunk
    (which decoders skip) keep contents unique and incompressible."""
    if size < _PNG_OVERHEAD:
        raise ValueError(f"a stand-in PNG takes at least {_PNG_OVERHEAD} bytes, asked for {size}")
    return SIGNATURE + _IHDR + _IDAT + _chunk(b"paDd", rng.bytes(size - _PNG_OVERHEAD)) + _IEND


def put(store, *trajs: Trajectory) -> list[bool]:
    """Commit trajectories the way ingestion does (blobs first, then one transaction)."""
    items = [(t, store.put_screenshots(t)) for t in trajs]
    with store.write() as w:
        return [store.insert_trajectory(w, t, d) for t, d in items]


def screenshots(seed: int, n: int) -> list[bytes]:
    """n PNG screenshots of the synthetic GUI suite, sizes cycling through SIZES."""
    out = []
    for i in range(n):
        w, h = SIZES[(seed + i) % len(SIZES)]
        env = SyntheticEnv(width=w, height=h)
        obs = env.reset(Task(f"synthetic/{TASKS[i % len(TASKS)]}/{seed}", "synthetic",
                             TASKS[i % len(TASKS)], seed=seed * 31 + i))
        env.close()
        out.append(obs.screenshot)
    return out


def trajectory(builder: PromptBuilder, traj_id: str, task_id: str, *, steps: int = 3, reward: float = 1.0,
               source: str = "rollout", version: int = 0, temperature: float = 1.0) -> Trajectory:
    """An episode as rollout_gpu.episode records it: exact prompt ids, responses, log-probs."""
    rng = np.random.default_rng(zlib.crc32(traj_id.encode()))
    shots = screenshots(zlib.crc32(traj_id.encode()) % 97, steps)
    images = [Image.open(io.BytesIO(png)).convert("RGB") for png in shots]
    responses, step_list = [], []
    for t in range(steps):
        prompt = builder.build(f"Do task {task_id}.", images[:t + 1], responses)
        text = f"Thought: step {t} of {traj_id}.\nAction: click(start_box='({10 + t},{20 + 3 * t})')"
        ids = builder.response_ids(text)
        first = t + 1 - len(prompt.images)
        step_list.append(Step(prompt_ids=prompt.token_ids, response_ids=ids,
                              logprobs=-rng.random(len(ids), dtype=np.float32),
                              image_refs=list(range(first, t + 1)), policy_version=version,
                              response_text=text, action=text.split("Action: ")[1]))
        responses.append(text)
    status = "success" if reward > 0 else "failure"
    return Trajectory(traj_id=traj_id, task_id=task_id, steps=step_list, screenshots=shots, reward=reward,
                      status=status, temperature=temperature, source=source)


def text_trajectory(rng: np.random.Generator, traj_id: str, task_id: str, reward: float, *,
                    max_steps: int = 2, prompt_len: tuple[int, int] = (8, 200),
                    response_len: tuple[int, int] = (2, 40)) -> Trajectory:
    """A screenshot-free episode of 1..max_steps steps whose prompt and response lengths are drawn
    from the given ranges (variable-length batches), token ids and log-probs at random."""
    steps = []
    for _ in range(int(rng.integers(1, max_steps + 1))):
        p, r = int(rng.integers(*prompt_len)), int(rng.integers(*response_len))
        steps.append(Step(prompt_ids=rng.integers(10, 500, p).astype(np.int32),
                          response_ids=rng.integers(10, 500, r).astype(np.int32),
                          logprobs=-rng.random(r, dtype=np.float32) * 6, image_refs=[],
                          policy_version=0, response_text="x"))
    return Trajectory(traj_id=traj_id, task_id=task_id, steps=steps, screenshots=[], reward=reward,
                      status="success" if reward else "failure")
