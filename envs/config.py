"""Configuration of the env server: its wire link, its slots (backends) and its policies.

    env_server:
      wire: {endpoint: "tcp://127.0.0.1:5555"}
      slots:
        - {type: miniwob, count: 4}
        - {type: synthetic, count: 16, difficulty: 2}
      invalid_action: penalty   # or: end
"""

from __future__ import annotations

import dataclasses
from typing import Literal, Union

from dart_jax.config import bounded
from dart_jax.wire.config import WireConfig
from envs.actions import ImageSpace

CHROME_ARGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
               "--disable-background-networking", "--disable-component-update", "--no-first-run",
               "--disable-sync", "--disable-extensions", "--disable-default-apps", "--mute-audio",
               "--no-default-browser-check", "--disable-features=Translate,MediaRouter",
               "--password-store=basic")


@dataclasses.dataclass(frozen=True)
class Latency:
    """Wall-clock time an env call takes on top of its work, standing in for slow real
    environments (an OSWorld VM takes seconds per step, with a heavy tail). `lognormal`:
    median_s * exp(sigma * z), z standard normal, capped at max_s; `fixed`: median_s."""
    kind: Literal["none", "fixed", "lognormal"] = "none"
    median_s: float = bounded(0.0, ge=0)
    sigma: float = bounded(1.0, ge=0)
    max_s: float = bounded(60.0, gt=0)
    seed: int = bounded(0, ge=0)


@dataclasses.dataclass(frozen=True)
class SyntheticSlots:
    type: Literal["synthetic"] = "synthetic"
    count: int = bounded(1, ge=1)
    width: int = bounded(400, ge=100)
    height: int = bounded(300, ge=100)
    difficulty: int = bounded(1, ge=1, le=3)  # default; a task's config may override it
    step_latency: Latency = Latency()  # per step, reset and evaluation


@dataclasses.dataclass(frozen=True)
class MiniWoBSlots:
    """MiniWoB++ in headless Chromium (one browser per slot). Rewards are the raw task
    rewards (no time scaling) and the page's wall-clock episode limit is lifted."""
    type: Literal["miniwob"] = "miniwob"
    count: int = bounded(1, ge=1)
    chrome_binary: str = "/usr/bin/chromium"
    chromedriver: str = "/usr/bin/chromedriver"
    headless: bool = True
    chrome_args: tuple[str, ...] = CHROME_ARGS
    settle_ms: float = bounded(0.0, ge=0)  # pause after each action (animations)
    scroll_px: int = bounded(50, ge=1)  # wheel distance of one scroll action


@dataclasses.dataclass(frozen=True)
class QemuSettings:
    """Desktop VMs this host boots itself (OSWorld `provider: qemu`, envs/osworld/qemu.py): the
    image `make setup-vm` builds, KVM where it boots and QEMU's software emulation (TCG)
    elsewhere, user-mode networking with the guest's ports 5000, 9222 and 8080 forwarded to
    loopback ports, and a memory + disk snapshot taken once the desktop answers, which every reset
    restores. `host_memory_mib` bounds what this server's VMs may take together (guest
    memory plus `overhead_mib` each): a config asking for more is refused, and a VM does
    not start while the host has less memory available than it needs. A task's first reset
    on a VM saves a snapshot after its setup, which its later resets restore."""
    image_dir: str = ""  # empty: the image built from this checkout's sources (envs/osworld/image.py)
    image: Literal["desktop", "osworld"] = "desktop"  # the build target (osworld: make setup-vm-osworld)
    accel: Literal["auto", "kvm", "tcg"] = "auto"  # auto: KVM when /dev/kvm opens, else TCG
    memory_mib: int = bounded(1024, ge=256)
    cpus: int = bounded(1, ge=1, le=64)
    overhead_mib: int = bounded(256, ge=0)  # QEMU itself and TCG's translation cache
    host_memory_mib: int = bounded(8192, ge=256)
    tb_size_mib: int = bounded(128, ge=16)  # TCG translation cache
    boot_timeout_s: float = bounded(300.0, gt=0)
    restore_timeout_s: float = bounded(60.0, gt=0)
    work_dir: str = ""  # overlays, sockets and console logs; empty: a fresh temporary folder
    # a snapshot per task after its setup (envs/osworld/snapshots.py), per VM at most this
    # many (0: none) and this much saved memory together; the least recently used go first
    task_snapshots: int = bounded(8, ge=0)
    task_snapshot_mib: int = bounded(4096, ge=0)
    kernel_args: str = "quiet nowatchdog"  # no soft-lockup noise when a loaded host starves the vCPU


@dataclasses.dataclass(frozen=True)
class OSWorldSlots:
    """OSWorld desktops. `provider: remote` talks to an in-VM server at `remote_url`
    (host:5000) without desktop-env; other providers start VMs through desktop-env's
    providers (a separate environment on OSWorld hosts, see envs/osworld/env.py). A task
    carries its example inline, or names a file by `path` relative to `task_dir` (resolved
    inside it; empty: no task may name a file on this host). `provider: qemu` boots the
    VMs itself (`qemu`), and a task may name a bundled example by its id alone
    (envs/osworld/tasks). `observe_windows` adds the desktop's window list (title, frame,
    focus) to each observation's element text; `accessibility_tree` adds the AT-SPI tree."""
    type: Literal["osworld"] = "osworld"
    count: int = bounded(1, ge=1)
    provider: Literal["remote", "qemu", "docker", "vmware", "virtualbox", "aws", "azure", "gcp"] = "docker"
    remote_urls: tuple[str, ...] = ()  # provider remote: one http://HOST:5000 per slot
    path_to_vm: str = ""
    region: str = ""
    snapshot_name: str = "init_state"
    os_type: str = "Ubuntu"
    screen_width: int = bounded(1920, ge=100)
    screen_height: int = bounded(1080, ge=100)
    accessibility_tree: bool = False
    cache_dir: str = "cache"
    task_dir: str = ""
    osworld_dir: str = ""  # a checkout of OSWorld: tasks named <domain>/<id> (envs/osworld/checkout.py)
    file_cache: str = ""  # the files tasks fetch on the host (envs/osworld/files.py); empty: none
    settle_s: float = bounded(1.0, ge=0)  # pause after each action before the screenshot
    http_timeout_s: float = bounded(60.0, gt=0)
    observe_windows: bool = False
    # OSWorld's own getters and metrics in a sidecar (envs/osworld/sidecar.py): the Python of
    # desktop-env's environment (make setup-osworld-eval: .venv-osworld-eval/bin/python);
    # empty: none, tasks outside envs/osworld/evaluation.py's evaluators are refused
    eval_sidecar: str = ""
    eval_timeout_s: float = bounded(120.0, gt=0)
    qemu: QemuSettings = QemuSettings()

    def __post_init__(self) -> None:
        if self.provider == "qemu":
            need = self.count * (self.qemu.memory_mib + self.qemu.overhead_mib)
            if need > self.qemu.host_memory_mib:
                raise ValueError(f"osworld qemu: {self.count} VMs of {self.qemu.memory_mib} MiB "
                                 f"(+{self.qemu.overhead_mib} MiB each) need {need} MiB, over "
                                 f"host_memory_mib {self.qemu.host_memory_mib}")


SlotSpec = Union[SyntheticSlots, MiniWoBSlots, OSWorldSlots]


@dataclasses.dataclass(frozen=True)
class EnvServerConfig:
    wire: WireConfig = WireConfig(endpoint="tcp://127.0.0.1:5555")
    slots: tuple[SlotSpec, ...] = (SyntheticSlots(count=4),)
    lease_s: float = bounded(60.0, gt=0)  # a client silent this long loses its slot
    start_timeout_s: float = bounded(600.0, gt=0)  # a backend's start (browser, VM boot), apart from calls
    reset_timeout_s: float = bounded(120.0, gt=0)
    step_timeout_s: float = bounded(60.0, gt=0)
    evaluate_timeout_s: float = bounded(300.0, gt=0)
    invalid_action: Literal["penalty", "end"] = "penalty"
    invalid_penalty: float = bounded(0.0, ge=0, le=1)  # subtracted per invalid step, reward >= 0
    reset_retries: int = bounded(1, ge=0)  # restarts of a failed backend before reset gives up
    image: ImageSpace = ImageSpace()  # the policy's image resizing: must match the rollout side

    def __post_init__(self) -> None:
        if not self.slots:
            raise ValueError("slots: at least one slot spec is needed")
        for spec in self.slots:
            if isinstance(spec, OSWorldSlots) and spec.provider == "remote" and \
                    len(spec.remote_urls) != spec.count:
                raise ValueError(f"osworld remote: {spec.count} slots need {spec.count} remote_urls, "
                                 f"got {len(spec.remote_urls)}")
