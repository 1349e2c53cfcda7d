"""The run's own sections: where it writes and how `dart-jax run` runs its roles (the
placement table), and which policy it starts from."""

from __future__ import annotations

import dataclasses
from typing import Literal

from dart_jax.config.loader import bounded


Role = Literal["data-manager", "env-server", "rollout", "trainer"]
Phase = Literal["demos", "sft", "eval", "rl"]


@dataclasses.dataclass(frozen=True)
class RoleSpec:
    """One row of the placement table: `count` processes of a role on a launcher. A role
    that dies is restarted (with backoff) up to `max_restarts` times; one more death stops
    the run. `resources` are the launcher's (Ray: {"GPU": 1} for a rollout worker; the row is
    one placement group of `count` such bundles, placed by `strategy`). The `tpu` launcher
    places the trainer on the Cloud TPU slice of the `tpu:` section. On the local launcher,
    `gpus` are the devices of the row's instances and `memory_fraction` what each takes of
    them (0: not said; dart_jax.run.devices), `env` more environment for its processes."""
    role: Role
    count: int = bounded(1, ge=1)
    launcher: Literal["local", "ray", "tpu"] = "local"
    max_restarts: int = bounded(5, ge=0)
    resources: dict[str, float] = dataclasses.field(default_factory=dict)
    strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = "PACK"
    gpus: tuple[int, ...] = ()
    memory_fraction: float = bounded(0.0, ge=0, le=1)
    env: dict[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.launcher == "tpu" and (self.role != "trainer" or self.count != 1):
            raise ValueError(f"launcher tpu places one trainer (the whole slice), not {self.count} x {self.role}")
        if self.gpus and self.launcher != "local":
            raise ValueError(f"{self.role}: gpus are the local launcher's ({self.launcher} places devices itself: "
                             "resources)")
        if self.gpus and self.role not in ("trainer", "rollout"):
            raise ValueError(f"{self.role} uses no GPU: gpus are for the trainer and rollout workers")
        if len(set(self.gpus)) != len(self.gpus) or any(g < 0 for g in self.gpus):
            raise ValueError(f"{self.role}: gpus {list(self.gpus)} must be distinct device numbers")
        if set(self.env) & {"CUDA_VISIBLE_DEVICES", "XLA_PYTHON_CLIENT_MEM_FRACTION"}:
            raise ValueError(f"{self.role}: say devices and memory with gpus and memory_fraction, not env")


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
