"""The tests' trajectory factories: realistic episodes (UI-TARS prompts over synthetic-env
screenshots, `trajectory`), screenshot-free text episodes of random lengths (`text_trajectory`),
and the trainer's views of them (collators, rows, curated batches laid out). Stores full of
small synthetic trajectories for the data manager come from dart_jax.testing.trajectories,
which the benchmarks share."""

from __future__ import annotations

import dataclasses
import io
import zlib

import jax
import numpy as np
from PIL import Image

from dart_jax.agent.prompt import PromptBuilder
from dart_jax.train.batch import BucketSpec, StepExample
from dart_jax.train.collate import Collator
from dart_jax.train.batch import StepRef
from dart_jax.train.batch import RLBatch
from dart_jax.train.collate import build_rows
from dart_jax.train.sources import layout_rl_batch
from dart_jax.train.screens import InlineScreens, ScreenCache
from dart_jax.wire.messages import CuratedBatch, Step, Trajectory
from envs.synthetic import TASKS, SyntheticEnv
from envs.types import Task

SIZES = ((400, 300), (280, 210), (320, 320))  # (width, height) of the synthetic screens
SPEC = dict(seq_lens=(768, 1024), num_slots=(768, 1536))  # holds every step these trajectories have


def collator(model_dir, rows: int, **spec) -> Collator:
    return Collator.from_pretrained(model_dir, BucketSpec(rows=rows, **{**SPEC, **spec}))


def examples(col: Collator, traj: Trajectory, steps=None) -> list[StepExample]:
    """Rows of `traj`'s steps (all by default), its screenshots taken from its own bytes."""
    screens = InlineScreens([traj])
    refs = [StepRef(0, i, *dataclasses.astuple(col.shape(traj, i, screens.refs(0))))
            for i in (range(len(traj.steps)) if steps is None else steps)]
    return build_rows(col, [traj], screens, ScreenCache(screens, col.image_cfg, 2**30), refs)


def layout_inline(trajs: list[Trajectory], col: Collator, batch_id: int = 1, **kw) -> RLBatch:
    """`trajs` planned as a curated batch, their screenshots taken from their own bytes."""
    screens = InlineScreens(trajs)
    batch = CuratedBatch(batch_id=batch_id, trainer_version=0, trajectories=trajs,
                         screens=[list(screens.refs(i)) for i in range(len(trajs))])
    return layout_rl_batch(batch, col, screens, shard=(0, 1), **kw)


def assert_trees_equal(a, b) -> None:
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(x, y)


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
