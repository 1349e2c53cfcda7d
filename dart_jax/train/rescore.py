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

from dart_jax.train.batch import Collator
from dart_jax.train.config import TrainerConfig
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
    refs = [(t, i) for t in trajectories for i in range(len(t.steps))]
    refs = [r for r in refs if collator.trainable(*r) and collator.buckets.fits(collator.shape(*r))]
    out: list[StepScore] = []
    rows = collator.buckets.rows
    for start in range(0, len(refs), rows):
        chunk = refs[start:start + rows]
        examples = [collator.examples(t, [i])[0] for t, i in chunk]
        mb = collator.collate(examples)
        logp_BxT = np.asarray(score(params, mb))
        for k, (t, i) in enumerate(chunk):
            on = mb.loss_mask_BxT[k] > 0
            out.append(StepScore(t.traj_id, i, t.steps[i].policy_version, len(t.steps[i].image_refs),
                                 mb.rollout_logp_BxT[k][on], logp_BxT[k][on]))
    return out
