"""Accelerators the trainer runs on: HBM per chip, chips per host, Cloud TPU type names.

HBM figures are the vendors' (TPU v5e 16 GiB, v5p 95 GiB, v6e 32 GiB; H100 80 GiB, H200
141 GiB). Multi-host TPU slices put 4 chips on each host VM (MaxText's table of slices lists
chips_per_host_bounds (2, 2, 1) for every v5e, v5p and v6e slice); GPU hosts hold 8.
Cloud TPU accelerator types count chips (`v6e-64`: 64 chips, `v5litepod-256`: 256 chips),
except v5p, which counts TensorCores, two per chip (`v5p-64`: 32 chips).
"""

from __future__ import annotations

import dataclasses

GIB = 2**30


@dataclasses.dataclass(frozen=True)
class Chip:
    label: str
    hbm_gib: float
    chips_per_host: int
    tpu_type_prefix: str  # the Cloud TPU accelerator type's prefix; "" for GPUs
    cores_per_chip: int = 1  # what one unit of the accelerator type's count is worth

    @property
    def hbm_bytes(self) -> int:
        return int(self.hbm_gib * GIB)

    @property
    def is_tpu(self) -> bool:
        return bool(self.tpu_type_prefix)


CHIPS: dict[str, Chip] = {
    "v5e": Chip("TPU v5e", 16, 4, "v5litepod"),
    "v5p": Chip("TPU v5p", 95, 4, "v5p", cores_per_chip=2),
    "v6e": Chip("TPU v6e", 32, 4, "v6e"),
    "h100": Chip("NVIDIA H100", 80, 8, ""),
    "h200": Chip("NVIDIA H200", 141, 8, ""),
}


def chip(name: str) -> Chip:
    if name not in CHIPS:
        raise ValueError(f"unknown chip {name!r}; known: {', '.join(CHIPS)}")
    return CHIPS[name]


def parse_accelerator_type(accelerator_type: str) -> tuple[str, int]:
    """(chip name, chips in the slice) of a Cloud TPU accelerator type such as `v5p-64`."""
    prefix, _, count = accelerator_type.rpartition("-")
    names = [k for k, c in CHIPS.items() if c.tpu_type_prefix == prefix]
    if not names or not count.isdigit() or int(count) % CHIPS[names[0]].cores_per_chip:
        known = ", ".join(f"{c.tpu_type_prefix}-N" for c in CHIPS.values() if c.is_tpu)
        raise ValueError(f"accelerator type {accelerator_type!r} is not one of {known}")
    return names[0], int(count) // CHIPS[names[0]].cores_per_chip
