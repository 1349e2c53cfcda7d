"""Desktop VMs under QEMU: boot, snapshot-restore reset, step, memory, for 1 and 2 VMs.

    python -m benchmarks.components.desktop_vm [--vms 1,2] [--resets 20] [--steps 20] [--accel auto]

First the saved booted desktop of this configuration is dropped, so the first VM boots the
`make setup-vm` image cold (until its in-VM server answers) and saves it again: that is
`cold_boot_s`. For each VM count the VMs then start at once from the saved desktop
(`start_s`: load it, the server answers, `savevm`), and each VM, all concurrently, runs
`--resets` restores of its ready snapshot (`loadvm` until the server answers again: the
reset of an episode, before any task setup; `loadvm_*` is the monitor command alone) and `--steps` steps (a pyautogui click at a
random point through /execute, then /screenshot: action to next screenshot, no settle
pause). Memory per VM is QEMU's RSS and PSS after the steps. The reference is in the same
run: a fresh boot per episode, as DART's release does (it then sleeps 60 s more), against
the snapshot restore (`cold_boot_over_reset_p50`). Prints one JSON object last.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import threading
import time

from benchmarks.common import machine
from envs.osworld import image as vm_image
from envs.config import QemuSettings
from envs.osworld.env import VMClient
from envs.osworld.qemu import QemuVM

SCREEN = (1280, 800)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _exercise(vm: QemuVM, resets: int, steps: int, seed: int, out: dict) -> None:
    client, rng = VMClient(vm.url, timeout_s=120), random.Random(seed)
    reset_s, loadvm_s, step_s = [], [], []
    for _ in range(resets):
        start = time.monotonic()
        vm.restore()
        reset_s.append(time.monotonic() - start)
        loadvm_s.append(vm.loadvm_s)
    for _ in range(steps):
        x, y = rng.randrange(SCREEN[0]), rng.randrange(SCREEN[1])
        start = time.monotonic()
        client.execute(f"pyautogui.click({x}, {y})")
        client.screenshot()
        step_s.append(time.monotonic() - start)
    out.update(reset_s=reset_s, loadvm_s=loadvm_s, step_s=step_s, memory_mib=vm.memory_mib())


def measure(count: int, settings: QemuSettings, resets: int, steps: int, cold_boot_s: float) -> dict:
    vms = [QemuVM(settings, SCREEN, f"bench{i}") for i in range(count)]
    try:
        threads = [threading.Thread(target=vm.start) for vm in vms]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if not all(vm.alive() and vm.start_s for vm in vms):
            raise RuntimeError(f"a VM did not boot: {[vm.console_tail() for vm in vms]}")
        results = [{} for _ in vms]
        threads = [threading.Thread(target=_exercise, args=(vm, resets, steps, i, results[i]))
                   for i, vm in enumerate(vms)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        resets_all = [s for r in results for s in r["reset_s"]]
        loadvm_all = [s for r in results for s in r["loadvm_s"]]
        steps_all = [s for r in results for s in r["step_s"]]
        return {"vms": count, "accel": vms[0].accel,
                "start_s": [round(vm.start_s, 1) for vm in vms], "snapshot_s": [round(vm.snapshot_s, 2) for vm in vms],
                "reset_p50_s": round(statistics.median(resets_all), 3), "reset_p95_s": round(_pct(resets_all, 0.95), 3),
                "loadvm_p50_s": round(statistics.median(loadvm_all), 3), "loadvm_p95_s": round(_pct(loadvm_all, 0.95), 3),
                "step_p50_s": round(statistics.median(steps_all), 3), "step_p95_s": round(_pct(steps_all, 0.95), 3),
                "rss_mib_per_vm": [round(r["memory_mib"]["rss"]) for r in results],
                "pss_mib_per_vm": [round(r["memory_mib"]["pss"]) for r in results],
                "cold_boot_over_reset_p50": round(cold_boot_s / statistics.median(resets_all), 1)}
    finally:
        for vm in vms:
            vm.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vms", default="1,2")
    parser.add_argument("--resets", type=int, default=20)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--accel", default="auto", choices=["auto", "kvm", "tcg"])
    parser.add_argument("--memory-mib", type=int, default=1024)
    args = parser.parse_args()
    settings = QemuSettings(accel=args.accel, memory_mib=args.memory_mib)
    image = vm_image.locate()
    cold = QemuVM(settings, SCREEN, "bench-cold")
    for path in cold.booted_paths():
        path.unlink(missing_ok=True)
    try:
        cold.start()
    finally:
        cold.kill()
    runs = []
    for count in (int(n) for n in args.vms.split(",")):
        runs.append(measure(count, settings, args.resets, args.steps, cold.cold_boot_s))
        print(json.dumps(runs[-1]), flush=True)
    manifest = json.loads((image.folder / "manifest.json").read_text())
    print(json.dumps({"benchmark": "desktop_vm", "machine": machine(), "screen": "{}x{}".format(*SCREEN),
                      "memory_mib": args.memory_mib, "resets": args.resets, "steps": args.steps,
                      "cold_boot_s": round(cold.cold_boot_s, 1), "image_build_s": manifest["seconds"], "image_qcow2_mib": round(manifest["qcow2_bytes"] / 2**20),
                      "runs": runs}))


if __name__ == "__main__":
    main()
