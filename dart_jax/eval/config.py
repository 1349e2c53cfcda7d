"""The held-out evaluation's settings (the `eval:` section)."""

from __future__ import annotations

import dataclasses

from dart_jax.config.loader import bounded


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    samples: int = bounded(4, ge=0)  # sampled episodes per eval task
    greedy: bool = True  # and one greedy episode per eval task
    max_steps: int = bounded(15, ge=1)
    concurrency: int = bounded(8, ge=1)
    seed: int = bounded(0, ge=0)
