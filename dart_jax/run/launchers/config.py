"""Launcher configs: a row of the placement table (which launcher starts how many of a role),
and the Cloud TPU slice a trainer is submitted to (`dart-jax tpu`)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import PurePosixPath
from typing import Literal

from dart_jax.config.loader import bounded

Role = Literal["data-manager", "env-server", "rollout", "trainer"]


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
        if self.env and self.launcher != "local":
            raise ValueError(f"{self.role}: env is the local launcher's (a {self.launcher} row would ignore it)")
        if self.gpus and self.role not in ("trainer", "rollout"):
            raise ValueError(f"{self.role} uses no GPU: gpus are for the trainer and rollout workers")
        if len(set(self.gpus)) != len(self.gpus) or any(g < 0 for g in self.gpus):
            raise ValueError(f"{self.role}: gpus {list(self.gpus)} must be distinct device numbers")
        if set(self.env) & {"CUDA_VISIBLE_DEVICES", "XLA_PYTHON_CLIENT_MEM_FRACTION"}:
            raise ValueError(f"{self.role}: say devices and memory with gpus and memory_fraction, not env")


GCLOUD_ID = re.compile(r"[a-z][a-z0-9.:-]*")  # project ids (domain-scoped too), zones, node names, types
# an NFS export (HOST:/path) or a bucket name: never a flag, a space or a shell character
MOUNT_SOURCE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(:/[A-Za-z0-9._/-]*)?")
VERSION = re.compile(r"[0-9][0-9a-z.]*")


@dataclasses.dataclass(frozen=True)
class SharedRoot:
    """The directory every host of the slice sees, mounted by the install step on every worker
    (and by you, at the same path, on the machine running `dart-jax run`). `nfs`: a Filestore
    (or any NFS) export `HOST:/share`; `gcsfuse`: a Cloud Storage bucket through Cloud Storage
    FUSE. A multi-host trainer's `run.root` must lie under `path`. A fresh NFS share is root's
    (0755) and each host's user has a uid of its own: every host's user joins the group `gid`
    (the same number everywhere; the head's user too), which the share is made writable to."""
    kind: Literal["none", "nfs", "gcsfuse"] = "none"
    source: str = ""  # 10.0.0.2:/runs (nfs) or my-bucket (gcsfuse)
    path: str = "/mnt/runs"
    gid: int = bounded(2000, ge=1)

    def __post_init__(self) -> None:
        if self.kind != "none" and not MOUNT_SOURCE.fullmatch(self.source):
            raise ValueError(f"shared_root.source {self.source!r}: an NFS export HOST:/path or a bucket name")
        path = PurePosixPath(self.path)
        if not path.is_absolute() or ".." in path.parts or not re.fullmatch(r"[A-Za-z0-9._/-]+", self.path):
            raise ValueError(f"shared_root.path {self.path!r} must be an absolute path of plain characters")


@dataclasses.dataclass(frozen=True)
class TPUConfig:
    """The Cloud TPU slice of a run and how its hosts install and start the trainer."""
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
    # The install brings its own interpreter (TPU VM images have Python 3.10; the pinned jax
    # needs >= 3.11): uv from the registry, then a uv-managed Python of this version.
    python: str = "3.11"
    uv_version: str = "0.13.8"
    extras: str = "tpu"  # the wheel's extras installed on every worker
    shared_root: SharedRoot = SharedRoot()
    setup_command: str = ""  # a shell command run in the workdir after the install (e.g. fetch the policy)
    launch_command: str = "dart-jax train"  # every host runs it with the shipped config appended
    poll_s: float = bounded(30.0, gt=0)
    active_timeout_s: float = bounded(6 * 3600.0, gt=0)
    # `dart-jax run` with the trainer on launcher tpu: attach to a trainer submitted before
    # (`dart-jax tpu submit`) instead of submitting it; how long its first heartbeat may take
    # (install, the policy's download, compilation) and the longest silence after that
    attach: bool = False
    keep: bool = False  # when the run ends, keep the queued resource it submitted (default: delete it; it bills)
    startup_timeout_s: float = bounded(2 * 3600.0, gt=0)
    heartbeat_timeout_s: float = bounded(600.0, gt=0)

    def __post_init__(self) -> None:
        for key in ("project", "zone", "name", "queued_resource", "accelerator_type", "runtime_version"):
            value = getattr(self, key)
            if value and not GCLOUD_ID.fullmatch(value):  # never a flag, a space or a shell character
                raise ValueError(f"{key} {value!r} is not a gcloud resource name ([a-z][a-z0-9.:-]*)")
        path = PurePosixPath(self.workdir)
        if not self.workdir or path.is_absolute() or ".." in path.parts:
            raise ValueError(f"workdir {self.workdir!r} must be a relative path below the home directory")
        for key in ("python", "uv_version"):
            if not VERSION.fullmatch(getattr(self, key)):
                raise ValueError(f"{key} {getattr(self, key)!r} is not a version number")
        if not re.fullmatch(r"[a-z][a-z0-9,-]*", self.extras):
            raise ValueError(f"extras {self.extras!r}: names like tpu or tpu,run")

    @property
    def queued_resource_id(self) -> str:
        return self.queued_resource or self.name
