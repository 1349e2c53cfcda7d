"""What `dart-jax plan` assumes beyond the trainer's own settings (the `plan:` section)."""

from __future__ import annotations

import dataclasses

from dart_jax.config.loader import bounded


@dataclasses.dataclass(frozen=True)
class PlanConfig:
    """What `dart-jax plan` assumes beyond the trainer's own settings."""
    model_config: str = ""  # a config.json (or its directory) used when policy.hf_dir is not here
    chip: str = ""  # v5e, v5p, v6e, h100, h200; "" = from tpu.accelerator_type
    screenshots: int = bounded(5, ge=0)  # per step (DART keeps the last 5)
    screen_width: int = bounded(1920, ge=1)
    screen_height: int = bounded(1080, ge=1)
    min_pixels: int = bounded(100 * 28 * 28, ge=1)  # UI-TARS-1.5's smart_resize bounds
    max_pixels: int = bounded(16384 * 28 * 28, ge=1)
    usable_hbm: float = bounded(0.9, gt=0.0, le=1.0)
