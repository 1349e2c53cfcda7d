"""A task's setup against the restore of its snapshot, per bundled task with a setup.

    python -m benchmarks.components.task_snapshots [--resets 5] [--restores N] [--accel auto] \
        [--image desktop|osworld] [--memory-mib 1024] [--tasks ID ...]

One desktop VM (the `make setup-vm` image, or `make setup-vm-osworld`'s with `--image
osworld`, started from its saved desktop, 1280x800) through the OSWorld backend. For each
bundled task of that image with setup steps (or those `--tasks` names): `--resets`
resets with task snapshots off (`loadvm ready`, the task's setup, the first observation:
what every reset cost before), then the first reset with them on (the same, plus `savevm`
of the task snapshot), then `--restores` (default `--resets`) resets that restore it
(`loadvm task-...`, the first observation; p95 by the nearest rank), and of those the
`loadvm` alone. Prints one JSON object last.
"""

from __future__ import annotations

import argparse
import json
import time

from benchmarks.common import machine, spread
from envs.config import OSWorldSlots, QemuSettings
from envs.osworld.env import OSWorldEnv, bundled_tasks
from envs.osworld.sidecar import VENV
from envs.types import Task


def _timed(env: OSWorldEnv, task: Task) -> float:
    start = time.monotonic()
    env.reset(task)
    return time.monotonic() - start


def _summary(values: list[float]) -> dict:
    return {**{k: round(v, 3) for k, v in spread(values).items()}, "all": [round(v, 3) for v in values]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resets", type=int, default=5)
    parser.add_argument("--restores", type=int, default=0, help="resets restoring the snapshot (0: --resets)")
    parser.add_argument("--accel", default="auto", choices=["auto", "kvm", "tcg"])
    parser.add_argument("--image", default="desktop", choices=["desktop", "osworld"])
    parser.add_argument("--memory-mib", type=int, default=1024)
    parser.add_argument("--tasks", nargs="*", default=[], help="bundled task ids (default: all with a setup)")
    args = parser.parse_args()
    # eval_sidecar: the tasks scored by OSWorld's own getters are not refused at reset (resets
    # never start the sidecar)
    slots = OSWorldSlots(provider="qemu", screen_width=1280, screen_height=800, observe_windows=True,
                         http_timeout_s=60.0, eval_sidecar=str(VENV / "bin" / "python"),
                         qemu=QemuSettings(accel=args.accel, image=args.image, memory_mib=args.memory_mib))
    tasks = bundled_tasks(args.image)
    if unknown := set(args.tasks) - set(tasks):
        parser.error(f"not bundled tasks of the {args.image} image: {', '.join(sorted(unknown))}")
    env = OSWorldEnv(slots)
    out: dict = {"machine": machine(), "accel": env.machine.accel, "image": args.image,
                 "memory_mib": args.memory_mib, "start_s": round(env.machine.start_s, 1),
                 "cold_boot_s": round(env.machine.cold_boot_s, 1), "resets": args.resets, "tasks": {}}
    try:
        for name, example in sorted(tasks.items()):
            if not example.get("config") or (args.tasks and name not in args.tasks):
                continue
            task = Task(f"osworld/{name}", "osworld", name)
            bound = env.snapshots.max_count
            env.snapshots.max_count = 0  # save nothing: every reset runs the setup
            with_setup = [_timed(env, task) for _ in range(args.resets)]
            env.snapshots.max_count = bound
            first = _timed(env, task)
            restored, loadvm = [], []
            for _ in range(args.restores or args.resets):
                restored.append(_timed(env, task))
                loadvm.append(env.machine.loadvm_s)
            saved = next(reversed(env.snapshots.sizes.values()))  # the one just saved
            out["tasks"][name] = {"reset_with_setup_s": _summary(with_setup),
                                  "first_reset_and_savevm_s": round(first, 3),
                                  "reset_restoring_snapshot_s": _summary(restored),
                                  "loadvm_s": _summary(loadvm),
                                  "saved_memory_mib": round(saved / 2**20, 1),
                                  "qemu_memory_mib": env.machine.memory_mib()}
            print(name, json.dumps(out["tasks"][name]), flush=True)
    finally:
        env.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
