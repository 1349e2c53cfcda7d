"""The run's own sections: where it writes and how `dart-jax run` runs its roles (the
placement table), and which policy it starts from."""

from __future__ import annotations

import dataclasses
from typing import Literal

from dart_jax.config.loader import bounded
from dart_jax.run.launchers.config import RoleSpec

Phase = Literal["demos", "sft", "eval", "rl"]
PLACEMENT = (RoleSpec("data-manager"), RoleSpec("env-server"), RoleSpec("rollout"), RoleSpec("trainer"))


@dataclasses.dataclass(frozen=True)
class RunSection:
    """Where the run writes (`root/name`, see dart_jax.rundir), its seed (not 0: the seed of
    every component, `RunConfig.seeded`), and how `dart-jax run` runs it. `mode`: async (DART: roles never wait on each other) or sync (rounds: roll
    out with the newest version, train on exactly that, publish, every worker syncs).
    `phases`, in order: demos (oracle demonstrations into the experience pool), sft
    (bootstrap on them), eval (held-out success), rl (the decoupled loop)."""
    name: str = "local"
    root: str = "runs"
    seed: int = bounded(0, ge=0)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    mode: Literal["async", "sync"] = "async"
    phases: tuple[Phase, ...] = ("rl",)
    placement: tuple[RoleSpec, ...] = PLACEMENT
    heartbeat_s: float = bounded(2.0, gt=0)
    ready_timeout_s: float = bounded(300.0, gt=0)
    view: Literal["auto", "live", "lines", "off"] = "auto"
    ray_address: str = ""  # roles placed on the `ray` launcher join this cluster ("" = auto)

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name or self.name.startswith("."):
            raise ValueError(f"run name {self.name!r} must be a plain directory name")


@dataclasses.dataclass(frozen=True)
class PolicySection:
    """The policy's Hugging Face directory (UI-TARS-1.5-7B, DART-GUI-7B, ...). Empty: the
    run builds a tiny Qwen2.5-VL-shaped policy with its own tokenizer (no download)."""
    hf_dir: str = ""
    tiny_seed: int = bounded(0, ge=0)
    tiny: dict[str, float] = dataclasses.field(default_factory=dict)  # TinySpec sizes (text_layers: 4, ...)
