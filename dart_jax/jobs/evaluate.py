"""Held-out check of a policy: teacher-forced NLL of demonstrations it never trained on.

    nll = demo_nll(hf_dir, "runs/local/data/eval_demos", cfg.trainer)

Mean negative log-likelihood per response token of the oracle's actions on evaluation
seeds, through the trainer's own fused kernel and shape buckets (few compiles).
"""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
from flax import nnx

from dart_jax.data.pool import read_trajectories
from dart_jax.models import hf_io
from dart_jax.train.batch import BucketSpec, Collator
from dart_jax.train.config import TrainerConfig
from dart_jax.train.step import token_scores


def demo_nll(hf_dir: str | Path, demos: str | Path, cfg: TrainerConfig) -> float:
    buckets = BucketSpec(cfg.buckets.seq_lens, cfg.buckets.num_slots, cfg.buckets.rows)
    collator = Collator.from_pretrained(hf_dir, buckets)
    model, _ = hf_io.load_model(hf_dir, dtype=cfg.compute_dtype)
    graphdef, params = nnx.split(model)
    logp_fn = jax.jit(lambda p, mb: token_scores(graphdef, p, mb, cfg)[0])
    examples = collator.fit([e for t in read_trajectories(Path(demos)) for e in collator.examples(t)])
    if not examples:
        raise ValueError(f"no demonstration steps under {demos} fit the trainer's buckets")
    total = count = 0.0
    for i in range(0, len(examples), buckets.rows):
        mb = collator.collate(examples[i:i + buckets.rows])
        logp_BxT = np.asarray(logp_fn(params, mb))
        total -= float((logp_BxT * mb.loss_mask_BxT).sum())
        count += float(mb.loss_mask_BxT.sum())
    return total / count
