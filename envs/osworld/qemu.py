"""One desktop VM under QEMU: boot, snapshot, restore, kill (OSWorld `provider: qemu`).

    vm = QemuVM(settings, screen=(1280, 800), name="slot0")
    vm.start()          # loads a booted desktop, waits for the in-VM server on port 5000,
                        # then snapshots memory + disk ("ready")
    vm.url              # http://127.0.0.1:PORT, the guest's port 5000 (user networking)
    vm.devtools_url     # http://127.0.0.1:PORT2, the guest's 9222 (the browser's DevTools)
    vm.vlc_url          # http://127.0.0.1:PORT3, the guest's 8080 (VLC's HTTP interface)
    vm.restore()        # back to the ready snapshot (QMP/HMP loadvm): the reset
    vm.save("task-x"); vm.restore("task-x"); vm.delete("task-x"); vm.snapshots()
                        # more snapshots in the overlay (envs/osworld/snapshots.py)
    vm.kill()           # SIGKILL of QEMU's process group, files removed

Booting takes a minute or more under TCG, so it happens once per host and configuration:
the first VM boots the image cold until its server answers, stops, and saves its memory
(migration to a file) beside the disk as it was then (a qcow2 layer over the image); every
VM starts by loading that state (`-incoming`, seconds) on its own overlay over that layer.
Each VM writes only to its overlay, so any number of VMs share the read-only image. The
ready snapshot lives in the overlay (`savevm`), so a restore brings back the disk and
memory as they were when the VM started. The guest's network is restricted (QEMU's
`restrict=on`): it reaches nothing, the host reaches its server, its browser's DevTools and
VLC's HTTP interface through the forwarded ports (loopback only). QEMU runs in its own process group,
registered with envs.reaper, so it dies with the env server whatever kills that.

Acceleration: KVM where /dev/kvm opens (`accel: auto` or `kvm`), QEMU's software emulation
(TCG) elsewhere; docs/desktop-vms.md has what KVM did on these (nested-virtualization) machines.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import shlex
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from dart_jax.wire import process_groups
from envs import reaper
from envs.osworld import image as vm_image
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
# The virtual machine apart from its disk, memory, kernel and sockets (a saved desktop is
# only loaded by the same).
_MACHINE = ("-machine", "q35", "-nodefaults", "-display", "none", "-vga", "none", "-no-reboot",
            "-device", "virtio-net-pci,netdev=net0", "-device", "virtio-rng-pci")
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
    prints anything (these machines; docs/desktop-vms.md), so /dev/kvm opening proves nothing. The
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
        process = process_groups.spawn(["qemu-system-x86_64", "-accel", "kvm", *_KVM_CPU, "-m", "256",
                                        "-nodefaults", "-display", "none", "-no-reboot", "-kernel", str(image.kernel),
                                        "-append", "console=ttyS0 earlyprintk=serial,ttyS0 panic=-1",
                                        "-serial", f"file:{console}"],
                                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        reaper.watch(process.pid)
        try:
            deadline = time.monotonic() + _KVM_PROBE_S
            while time.monotonic() < deadline and process.poll() is None:
                if console.exists() and b"Linux version" in console.read_bytes():
                    return True
                time.sleep(0.2)
            return console.exists() and b"Linux version" in console.read_bytes()
        finally:
            process_groups.kill(process)
            reaper.forget(process.pid)


def available_mib() -> int:
    """MemAvailable of this host (/proc/meminfo), in MiB."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) // 1024
    raise EnvError("no MemAvailable in /proc/meminfo")


def _overlay(backing: Path, path: Path) -> Path:
    """A new qcow2 at `path` whose reads fall through to `backing` (never written)."""
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(backing), "-F", "qcow2", str(path)],
                   check=True, capture_output=True, timeout=60)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class QemuVM:
    """One QEMU process running the desktop image (see the module docstring)."""

    def __init__(self, settings: QemuSettings, screen: tuple[int, int], name: str = "vm"):
        self.settings, self.screen, self.name = settings, screen, name
        self.image = vm_image.locate(settings.image_dir, settings.image)
        self.accel = choose_accel(settings.accel, self.image)
        self.process: subprocess.Popen | None = None
        self.port = self.devtools_port = self.vlc_port = 0  # loopback ports of the guest's 5000, 9222, 8080
        self.dir: Path | None = None
        self.start_s = self.cold_boot_s = self.snapshot_s = self.loadvm_s = 0.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def devtools_url(self) -> str:
        """The guest browser's DevTools port (9222 in the guest), forwarded to loopback."""
        return f"http://127.0.0.1:{self.devtools_port}"

    @property
    def vlc_url(self) -> str:
        """VLC's HTTP interface (8080 in the guest, the `osworld` image), forwarded to loopback."""
        return f"http://127.0.0.1:{self.vlc_port}"

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
        try:
            state, disk = self._booted_state()
            start = time.monotonic()
            self._launch(_overlay(disk, self.dir / "overlay.qcow2"), incoming=state)
            self._resume_incoming(start + s.boot_timeout_s, state)
            self._wait_ready(start + s.boot_timeout_s)
            self.start_s = time.monotonic() - start
            start = time.monotonic()
            self.hmp(f"savevm {SNAPSHOT}")
            self.snapshot_s = time.monotonic() - start
        except BaseException:
            self.kill()
            raise
        log.info("%s: %s start %.1f s (cold boot %.1f s), snapshot %.2f s, server %s", self.name, self.accel,
                 self.start_s, self.cold_boot_s, self.snapshot_s, self.url)
        return self

    # A booted desktop, saved once per host and configuration: a VM starts by loading it
    # (seconds) instead of booting (a minute or more under TCG). The saved memory goes with
    # the disk as it was at that moment, kept as a read-only qcow2 layer over the image that
    # each VM's overlay stacks on.

    def booted_paths(self) -> tuple[Path, Path]:
        """Where this configuration's booted desktop is saved: (memory state, disk layer)."""
        folder = self.image.folder / "booted"
        key = self._state_key()
        return folder / f"{key}.state", folder / f"{key}.qcow2"

    def _booted_state(self) -> tuple[Path, Path]:
        """(memory state, disk layer) of a booted desktop for this configuration; the first
        VM to need them boots cold and saves them (others wait on the lock)."""
        state, disk = self.booted_paths()
        state.parent.mkdir(exist_ok=True)
        with open(state.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (state.exists() and disk.exists()):
                self._save_booted(state, disk)
        return state, disk

    def _state_key(self) -> str:
        s = self.settings
        version = subprocess.run(["qemu-system-x86_64", "--version"], capture_output=True, text=True).stdout
        text = "|".join(map(str, (version.splitlines()[:1], self.accel, _KVM_CPU, _MACHINE, s.memory_mib,
                                  s.cpus, self._kernel_command_line())))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def _save_booted(self, state: Path, disk: Path) -> None:
        tmp_state, tmp_disk = state.with_suffix(".state-tmp"), disk.with_suffix(".qcow2-tmp")
        start = time.monotonic()
        self._launch(_overlay(self.image.disk, tmp_disk), incoming=None)
        try:
            self._wait_ready(start + self.settings.boot_timeout_s)
            self.cold_boot_s = time.monotonic() - start
            self.qmp("stop")  # the disk layer and the saved memory must agree: nothing runs between
            self.qmp("migrate", uri=f"exec:cat > {shlex.quote(str(tmp_state))}")
            deadline = time.monotonic() + self.settings.boot_timeout_s
            while (status := self.qmp("query-migrate").get("status")) not in ("completed", "failed", "cancelled"):
                if time.monotonic() > deadline:
                    raise EnvError(f"{self.name}: saving the booted desktop took over "
                                   f"{self.settings.boot_timeout_s:g} s")
                time.sleep(0.2)
            if status != "completed":
                raise EnvError(f"{self.name}: saving the booted desktop failed ({status})")
            with contextlib.suppress(EnvError):  # QEMU may close the monitor before it answers
                self.qmp("quit")
            self.process.wait(timeout=60)  # a clean exit writes the disk layer's metadata out
        except BaseException:
            tmp_state.unlink(missing_ok=True)
            raise
        finally:
            self._stop_process()
        os.replace(tmp_disk, disk)
        os.replace(tmp_state, state)
        log.info("%s: saved a booted desktop (%s, cold boot %.1f s) in %s", self.name, self.accel,
                 self.cold_boot_s, state.parent)

    def _resume_incoming(self, deadline: float, state: Path) -> None:
        """Until the saved desktop is loaded; then let it run."""
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                error = self._stderr()
                if "load" in error.lower() or "migrat" in error.lower():
                    state.unlink(missing_ok=True)  # a state this QEMU cannot load: the next start saves anew
                raise EnvError(f"{self.name}: QEMU exited loading the booted desktop: {error}")
            with contextlib.suppress(EnvError):
                status = self.qmp("query-status")["status"]
                if status not in ("inmigrate", "prelaunch"):
                    if status != "running":
                        self.qmp("cont")
                    return
            time.sleep(0.2)
        raise EnvError(f"{self.name}: loading the booted desktop took over {self.settings.boot_timeout_s:g} s")

    def _launch(self, overlay: Path, incoming: Path | None) -> None:
        for attempt in range(3):  # a port taken between choosing and binding: choose again
            self.port, self.devtools_port, self.vlc_port = free_port(), free_port(), free_port()
            command = self.command(overlay, incoming)
            self.process = process_groups.spawn(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                                stderr=open(self.dir / "qemu.err", "wb"))
            reaper.watch(self.process.pid, self.dir)  # a killed server's VM leaves no files either
            time.sleep(0.3)
            if self.process.poll() is None:
                return
            reaper.forget(self.process.pid)
            error = self._stderr()
            if "hostfwd" not in error:
                break
        raise EnvError(f"{self.name}: QEMU exited at start: {error}")

    def _stderr(self) -> str:
        return (self.dir / "qemu.err").read_text(errors="replace").strip()[-500:]

    def command(self, overlay: Path, incoming: Path | None) -> list[str]:
        s = self.settings
        accel = "kvm" if self.accel == "kvm" else f"tcg,tb-size={s.tb_size_mib}"
        return ["qemu-system-x86_64", "-name", f"dart-{self.name}", "-accel", accel,
                *(_KVM_CPU if self.accel == "kvm" else []), *_MACHINE,
                "-m", str(s.memory_mib), "-smp", str(s.cpus), "-append", self._kernel_command_line(),
                "-kernel", str(self.image.kernel), "-initrd", str(self.image.initrd),
                "-drive", f"file={overlay},if=virtio,format=qcow2,cache=unsafe",
                "-netdev", f"user,id=net0,restrict=on,hostfwd=tcp:127.0.0.1:{self.port}-:5000"
                f",hostfwd=tcp:127.0.0.1:{self.devtools_port}-:9222,hostfwd=tcp:127.0.0.1:{self.vlc_port}-:8080",
                "-serial", f"file:{self.console}", "-qmp", f"unix:{self.dir / 'qmp.sock'},server=on,wait=off",
                *(["-incoming", f"exec:cat {shlex.quote(str(incoming))}"] if incoming else [])]

    def _kernel_command_line(self) -> str:
        screen = "{}x{}".format(*self.screen)
        return f"root=/dev/vda rw console=ttyS0 dart.screen={screen} {self.settings.kernel_args}".strip()

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

    def restore(self, snapshot: str = SNAPSHOT) -> None:
        """Memory and disk back to `snapshot` (the ready one by default); the server answers
        again."""
        if not self.alive():
            raise EnvError(f"{self.name}: QEMU is not running (exit {self.process.returncode})")
        start = time.monotonic()
        self.hmp(f"loadvm {snapshot}")
        self.loadvm_s = time.monotonic() - start
        deadline = start + self.settings.restore_timeout_s
        while not self._answers("/platform", timeout_s=5.0):
            if time.monotonic() > deadline:
                raise EnvError(f"{self.name}: no answer {self.settings.restore_timeout_s:g} s after loadvm")
            time.sleep(0.1)

    def save(self, snapshot: str) -> None:
        """Memory and disk as they are now, as `snapshot` in the overlay (savevm; replaces
        one of that name)."""
        self.hmp(f"savevm {snapshot}")

    def delete(self, snapshot: str) -> None:
        self.hmp(f"delvm {snapshot}")

    def snapshots(self) -> dict[str, int]:
        """The overlay's snapshots: name -> bytes of saved memory (QMP query-block)."""
        for device in self.qmp("query-block"):
            image = (device.get("inserted") or {}).get("image") or {}
            if image.get("filename") == str(self.dir / "overlay.qcow2"):
                return {s["name"]: int(s.get("vm-state-size", 0)) for s in image.get("snapshots", [])}
        raise EnvError(f"{self.name}: QEMU monitor: no overlay disk in query-block")

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        self._stop_process()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)

    def _stop_process(self) -> None:
        process, self.process = self.process, None
        if process is not None:
            process_groups.kill(process, timeout_s=30)
            reaper.forget(process.pid)

    close = kill  # the overlay is disposable: nothing in the guest needs a clean shutdown

    # ---- the monitor ----------------------------------------------------------------------

    def qmp(self, command: str, **arguments: object) -> Any:
        """One QMP command on a fresh connection; its return value."""
        from qemu.qmp.legacy import QEMUMonitorProtocol
        monitor = QEMUMonitorProtocol(str(self.dir / "qmp.sock"))
        monitor.settimeout(_QMP_TIMEOUT_S)
        try:
            monitor.connect()
            return monitor.cmd(command, **arguments)
        except Exception as e:
            raise EnvError(f"{self.name}: QEMU monitor: {command} failed: {type(e).__name__}: {e}") from None
        finally:
            with contextlib.suppress(Exception):  # a QEMU that quit has closed its end already
                monitor.close()

    def hmp(self, command: str) -> str:
        """A human-monitor command over QMP (savevm/loadvm have no plain QMP form in 7.2)."""
        text = str(self.qmp("human-monitor-command", **{"command-line": command}))
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
