"""The trainer's views of the tests' trajectories (dart_jax.testing.trajectories): collators,
rows, curated batches laid out."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from dart_jax.train.batch import BucketSpec, StepExample
from dart_jax.train.collate import Collator
from dart_jax.train.batch import StepRef
from dart_jax.train.batch import RLBatch
from dart_jax.train.collate import build_rows
from dart_jax.train.sources import layout_rl_batch
from dart_jax.train.screens import InlineScreens, ScreenCache
from dart_jax.wire.messages import CuratedBatch, Trajectory

SPEC = dict(seq_lens=(768, 1024), num_slots=(768, 1536))  # holds every step these trajectories have


def collator(model_dir, rows: int, **spec) -> Collator:
    return Collator.from_pretrained(model_dir, BucketSpec(rows=rows, **{**SPEC, **spec}))


def examples(col: Collator, traj: Trajectory, steps=None) -> list[StepExample]:
    """Rows of `traj`'s steps (all by default), its screenshots taken from its own bytes."""
    screens = InlineScreens([traj])
    refs = [StepRef(0, i, *dataclasses.astuple(col.shape(traj, i, screens.refs(0))))
            for i in (range(len(traj.steps)) if steps is None else steps)]
    return build_rows(col, [traj], screens, ScreenCache(screens, col.image_cfg, 2**30), refs)


def layout_inline(trajs: list[Trajectory], col: Collator, batch_id: int = 1, injected: tuple[str, ...] = (),
                  **kw) -> RLBatch:
    """`trajs` planned as a curated batch (`injected`: the ids the pool put in), their
    screenshots taken from their own bytes."""
    screens = InlineScreens(trajs)
    batch = CuratedBatch(batch_id=batch_id, trainer_version=0, trajectories=trajs, injected=list(injected),
                         screens=[list(screens.refs(i)) for i in range(len(trajs))])
    return layout_rl_batch(batch, col, screens, shard=(0, 1), **kw)


def assert_trees_equal(a, b) -> None:
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(x, y)
