"""Launcher configs: the Cloud TPU slice a trainer is submitted to (`dart-jax tpu`)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import PurePosixPath
from typing import Literal

from dart_jax.config.loader import bounded

GCLOUD_ID = re.compile(r"[a-z][a-z0-9.:-]*")  # project ids (domain-scoped too), zones, node names, types


@dataclasses.dataclass(frozen=True)
class TPUConfig:
    """The Cloud TPU slice of a run and how its hosts start the trainer."""
    project: str = ""
    zone: str = ""  # e.g. us-east5-a (v5p), us-east5-b (v6e), us-west4-a (v5e)
    name: str = ""  # the TPU VM (node id)
    queued_resource: str = ""  # the queued resource id; "" = the node's name
    accelerator_type: str = ""  # v5p-64, v6e-64, v5litepod-256
    runtime_version: str = ""  # v2-alpha-tpuv5 (v5p), v2-alpha-tpuv6e (v6e), v2-alpha-tpuv5-lite (v5e)
    provisioning: Literal["on-demand", "spot", "reserved", "best-effort"] = "on-demand"
    network: str = ""  # "" = gcloud's default network
    subnetwork: str = ""
    internal_ips: bool = False  # no external IPs; ssh and scp then go by internal IP
    service_account: str = ""
    valid_until_duration: str = ""  # stop waiting for capacity after this long, e.g. 6h
    workdir: str = "dart-jax"  # on every worker, relative to the login's home; commands run in it
    install_command: str = 'python3 -m pip install --upgrade "dart-jax[tpu]"'  # a shell command
    launch_command: str = "dart-jax train"  # every host runs it with the shipped config appended
    poll_s: float = bounded(30.0, gt=0)
    active_timeout_s: float = bounded(6 * 3600.0, gt=0)

    def __post_init__(self) -> None:
        for key in ("project", "zone", "name", "queued_resource", "accelerator_type", "runtime_version"):
            value = getattr(self, key)
            if value and not GCLOUD_ID.fullmatch(value):  # never a flag, a space or a shell character
                raise ValueError(f"{key} {value!r} is not a gcloud resource name ([a-z][a-z0-9.:-]*)")
        path = PurePosixPath(self.workdir)
        if not self.workdir or path.is_absolute() or ".." in path.parts:
            raise ValueError(f"workdir {self.workdir!r} must be a relative path below the home directory")

    @property
    def queued_resource_id(self) -> str:
        return self.queued_resource or self.name
