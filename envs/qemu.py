"""One desktop VM under QEMU: boot, snapshot, restore, kill (OSWorld `provider: qemu`).

    vm = QemuVM(settings, screen=(1280, 800), name="slot0")
    vm.start()          # boots a copy-on-write overlay of the image, waits for the in-VM
                        # server on port 5000, then snapshots memory + disk ("ready")
    vm.url              # http://127.0.0.1:PORT, the guest's port 5000 (user networking)
    vm.restore()        # back to the ready snapshot (QMP/HMP loadvm): the reset
    vm.kill()           # SIGKILL of QEMU's process group, files removed

Each VM writes only to its own qcow2 overlay over the shared read-only image, so any number
of VMs share one image. The snapshot lives in the overlay (`savevm`), so a restore brings
back the disk and memory as they were when the desktop first answered. The guest's
network is restricted (QEMU's `restrict=on`): it reaches nothing, the host reaches its
server through the forwarded port. QEMU runs in its own process group, registered with
envs.reaper, so it dies with the env server whatever kills that.

Acceleration: KVM where /dev/kvm opens (`accel: auto` or `kvm`), QEMU's software emulation
(TCG) elsewhere; BUILD.md has what KVM did on these (nested-virtualization) machines.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from envs import reaper, vm_image
from envs.config import QemuSettings
from envs.types import EnvError

log = logging.getLogger(__name__)

SNAPSHOT = "ready"
_QMP_TIMEOUT_S = 30.0


def kvm_usable() -> bool:
    try:
        fd = os.open("/dev/kvm", os.O_RDWR)
    except OSError:
        return False
    os.close(fd)
    return True


_KVM_PROBE_S = 20.0
_KVM_CPU = ("-cpu", "host")
_kvm_boots: dict[Path, bool] = {}
_probe_lock = threading.Lock()


def choose_accel(accel: str, image: vm_image.Image) -> str:
    """kvm or tcg for `accel`; `auto` takes KVM only where it boots the image's kernel."""
    if accel == "kvm" and not kvm_usable():
        raise EnvError("accel kvm: /dev/kvm cannot be opened on this host")
    if accel != "auto":
        return accel
    return "kvm" if kvm_usable() and kvm_boots(image) else "tcg"


def kvm_boots(image: vm_image.Image) -> bool:
    """Whether KVM runs the image's kernel on this host: it boots the kernel alone and waits
    for its first console line. Under nested virtualization a guest can hang before it
    prints anything (these machines; BUILD.md), so /dev/kvm opening proves nothing. The
    answer is kept for the life of the process."""
    with _probe_lock:
        if image.kernel not in _kvm_boots:
            _kvm_boots[image.kernel] = _probe_kvm(image)
            if not _kvm_boots[image.kernel]:
                log.warning("KVM did not boot %s (no console line within %g s, or QEMU failed): "
                            "desktop VMs use TCG (software emulation)", image.kernel, _KVM_PROBE_S)
        return _kvm_boots[image.kernel]


def _probe_kvm(image: vm_image.Image) -> bool:
    with tempfile.TemporaryDirectory(prefix="dart-kvm-probe-") as tmp:
        console = Path(tmp) / "console.log"
        process = subprocess.Popen(["qemu-system-x86_64", "-accel", "kvm", *_KVM_CPU, "-m", "256", "-nodefaults",
                                    "-display", "none", "-no-reboot", "-kernel", str(image.kernel),
                                    "-append", "console=ttyS0 earlyprintk=serial,ttyS0 panic=-1",
                                    "-serial", f"file:{console}"],
                                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                   start_new_session=True)
        reaper.watch(process.pid)
        try:
            deadline = time.monotonic() + _KVM_PROBE_S
            while time.monotonic() < deadline and process.poll() is None:
                if console.exists() and b"Linux version" in console.read_bytes():
                    return True
                time.sleep(0.2)
            return console.exists() and b"Linux version" in console.read_bytes()
        finally:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            reaper.forget(process.pid)


def available_mib() -> int:
    """MemAvailable of this host (/proc/meminfo), in MiB."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) // 1024
    raise EnvError("no MemAvailable in /proc/meminfo")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class QemuVM:
    """One QEMU process running the desktop image (see the module docstring)."""

    def __init__(self, settings: QemuSettings, screen: tuple[int, int], name: str = "vm"):
        self.settings, self.screen, self.name = settings, screen, name
        self.image = vm_image.locate(settings.image_dir)
        self.accel = choose_accel(settings.accel, self.image)
        self.process: subprocess.Popen | None = None
        self.port = 0
        self.dir: Path | None = None
        self.boot_s = self.snapshot_s = 0.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def console(self) -> Path:
        return self.dir / "console.log"

    # ---- life ----------------------------------------------------------------------------

    def start(self) -> "QemuVM":
        s = self.settings
        need = s.memory_mib + s.overhead_mib
        if available_mib() < need:
            raise EnvError(f"{self.name}: the host has {available_mib()} MiB available, a VM needs {need} MiB")
        self.dir = Path(tempfile.mkdtemp(prefix=f"dart-vm-{self.name}-", dir=s.work_dir or None))
        overlay = self.dir / "overlay.qcow2"
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(self.image.disk), "-F", "qcow2",
                        str(overlay)], check=True, capture_output=True, timeout=60)
        start = time.monotonic()
        self._launch(overlay)
        self._wait_ready(start + s.boot_timeout_s)
        self.boot_s = time.monotonic() - start
        start = time.monotonic()
        self.hmp(f"savevm {SNAPSHOT}")
        self.snapshot_s = time.monotonic() - start
        log.info("%s: %s boot %.1f s, snapshot %.2f s, server %s", self.name, self.accel, self.boot_s,
                 self.snapshot_s, self.url)
        return self

    def _launch(self, overlay: Path) -> None:
        s, width_height = self.settings, "{}x{}".format(*self.screen)
        for attempt in range(3):  # a port taken between choosing and binding: choose again
            self.port = free_port()
            command = self.command(overlay, width_height)
            self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                            stderr=open(self.dir / "qemu.err", "wb"), start_new_session=True)
            reaper.watch(self.process.pid)
            time.sleep(0.3)
            if self.process.poll() is None:
                return
            reaper.forget(self.process.pid)
            error = (self.dir / "qemu.err").read_text(errors="replace").strip()
            if "hostfwd" not in error:
                break
        raise EnvError(f"{self.name}: QEMU exited at start: {error[-500:]}")

    def command(self, overlay: Path, width_height: str) -> list[str]:
        s = self.settings
        accel = "kvm" if self.accel == "kvm" else f"tcg,tb-size={s.tb_size_mib}"
        append = f"root=/dev/vda rw console=ttyS0 dart.screen={width_height} {s.kernel_args}".strip()
        return ["qemu-system-x86_64", "-name", f"dart-{self.name}", "-machine", "q35", "-accel", accel,
                *(_KVM_CPU if self.accel == "kvm" else []),
                "-m", str(s.memory_mib), "-smp", str(s.cpus), "-nodefaults", "-display", "none", "-vga", "none",
                "-kernel", str(self.image.kernel), "-initrd", str(self.image.initrd), "-append", append,
                "-drive", f"file={overlay},if=virtio,format=qcow2,cache=unsafe",
                "-netdev", f"user,id=net0,restrict=on,hostfwd=tcp:127.0.0.1:{self.port}-:5000",
                "-device", "virtio-net-pci,netdev=net0", "-device", "virtio-rng-pci",
                "-serial", f"file:{self.console}", "-qmp", f"unix:{self.dir / 'qmp.sock'},server=on,wait=off",
                "-no-reboot"]

    def _wait_ready(self, deadline: float) -> None:
        """Until the in-VM server returns a screenshot (the desktop is up)."""
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise EnvError(f"{self.name}: QEMU exited during boot (code {self.process.returncode}); "
                               f"console: {self.console_tail()}")
            if self._answers("/screenshot"):
                return
            time.sleep(1.0)
        raise EnvError(f"{self.name}: the desktop did not answer within {self.settings.boot_timeout_s:g} s "
                       f"({self.accel}); console: {self.console_tail()}")

    def _answers(self, path: str, timeout_s: float = 10.0) -> bool:
        try:
            with urllib.request.urlopen(self.url + path, timeout=timeout_s) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def restore(self) -> None:
        """Memory and disk back to the ready snapshot; the server answers again."""
        if not self.alive():
            raise EnvError(f"{self.name}: QEMU is not running (exit {self.process.returncode})")
        self.hmp(f"loadvm {SNAPSHOT}")
        deadline = time.monotonic() + self.settings.restore_timeout_s
        while not self._answers("/platform", timeout_s=5.0):
            if time.monotonic() > deadline:
                raise EnvError(f"{self.name}: no answer {self.settings.restore_timeout_s:g} s after loadvm")
            time.sleep(0.1)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        process, self.process = self.process, None
        if process is not None:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            process.wait(timeout=30)
            reaper.forget(process.pid)
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)

    close = kill  # the overlay is disposable: nothing in the guest needs a clean shutdown

    # ---- the monitor ----------------------------------------------------------------------

    def hmp(self, command: str) -> str:
        """A human-monitor command over QMP (savevm/loadvm have no plain QMP form in 7.2)."""
        from qemu.qmp.legacy import QEMUMonitorProtocol
        monitor = QEMUMonitorProtocol(str(self.dir / "qmp.sock"))
        monitor.settimeout(_QMP_TIMEOUT_S)
        try:
            monitor.connect()
            text = str(monitor.cmd("human-monitor-command", **{"command-line": command}))
        except Exception as e:
            raise EnvError(f"{self.name}: QEMU monitor: {command!r} failed: {type(e).__name__}: {e}") from None
        finally:
            monitor.close()
        if text.strip().lower().startswith("error"):  # HMP reports its failures as text
            raise EnvError(f"{self.name}: QEMU monitor: {command!r}: {text.strip()}")
        return text

    def memory_mib(self) -> dict[str, float]:
        """QEMU's resident and proportional memory (smaps_rollup), in MiB."""
        fields = {}
        with open(f"/proc/{self.process.pid}/smaps_rollup") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("Rss", "Pss"):
                    fields[key.lower()] = int(rest.split()[0]) / 1024
        return fields

    def console_tail(self, chars: int = 600) -> str:
        try:
            return self.console.read_text(errors="replace")[-chars:].replace("\n", " | ")
        except OSError:
            return "(no console log)"
