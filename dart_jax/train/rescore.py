"""The trainer's view of what a rollout engine sampled: each step's tokens scored again.

    scores = rescore((graphdef, params), trajectories, collator, cfg)
    gaps = np.abs(scores[0].policy_logp_R - scores[0].sampled_logp_R)

The same path the train step takes (collator, shape buckets, the fused log-prob kernel at
each rollout's temperature), so the gap it shows is the gap truncated importance sampling
corrects: used by the parity benchmark and the weight-sync tests.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import numpy as np

from dart_jax.train.collate import Collator
from dart_jax.train.config import TrainerConfig
from dart_jax.train.collate import build_rows, step_refs
from dart_jax.train.sources import every_step
from dart_jax.train.screens import InlineScreens, ScreenCache
from dart_jax.train.step import token_scores
from dart_jax.wire.messages import Trajectory


@dataclasses.dataclass(frozen=True)
class StepScore:
    traj_id: str
    step: int
    policy_version: int
    images: int
    sampled_logp_R: np.ndarray  # what the engine reported
    policy_logp_R: np.ndarray  # what the given parameters give the same tokens


def rescore(model, trajectories: Sequence[Trajectory], collator: Collator, cfg: TrainerConfig) -> list[StepScore]:
    """Every trainable step of `trajectories` that fits a bucket, scored by `model = (graphdef, params)`."""
    graphdef, params = model
    score = jax.jit(lambda p, mb: token_scores(graphdef, p, mb, cfg)[0])
    screens = InlineScreens(trajectories)
    refs = [r for r in step_refs(trajectories, screens, collator, every_step) if collator.buckets.fits(r)]
    cache = ScreenCache(screens, collator.image_cfg, cfg.screen_cache_bytes)
    out: list[StepScore] = []
    rows = collator.buckets.rows
    for start in range(0, len(refs), rows):
        chunk = refs[start:start + rows]
        mb = collator.collate(build_rows(collator, trajectories, screens, cache, chunk))
        logp_NxT = np.asarray(score(params, mb))
        for k, r in enumerate(chunk):  # row k holds one step, in its first slot
            on, step = mb.loss_mask_BxPxT[k, 0] > 0, trajectories[r.traj].steps[r.step]
            out.append(StepScore(trajectories[r.traj].traj_id, r.step, step.policy_version, len(step.image_refs),
                                 mb.rollout_logp_BxPxT[k, 0][on], logp_NxT[k * collator.buckets.pack][on]))
    return out
