"""Backend factory: a slot spec -> a fresh `Env`; heavy backends are imported lazily."""

from __future__ import annotations

from envs.config import MiniWoBSlots, OSWorldSlots, SlotSpec, SyntheticSlots
from envs.types import Env


def make_env(spec: SlotSpec, index: int = 0) -> Env:
    """A new environment for slot `index` of its spec (starts a browser or VM if needed)."""
    if isinstance(spec, SyntheticSlots):
        from envs.synthetic import SyntheticEnv
        return SyntheticEnv(spec.width, spec.height, spec.difficulty, spec.step_latency, index)
    if isinstance(spec, MiniWoBSlots):
        from envs.miniwob_env import MiniWoBEnv
        return MiniWoBEnv(spec)
    if isinstance(spec, OSWorldSlots):
        from envs.osworld.env import OSWorldEnv
        return OSWorldEnv(spec, index)
    raise TypeError(f"unknown slot spec {type(spec).__name__}")


def task_names(spec: SlotSpec) -> list[str]:
    """The task names a backend serves (OSWorld: the bundled tasks of the slots' image;
    other OSWorld tasks travel in their TaskSpec's config)."""
    if isinstance(spec, SyntheticSlots):
        from envs.synthetic import TASKS
        return list(TASKS)
    if isinstance(spec, MiniWoBSlots):
        from envs.miniwob_env import task_names as miniwob_tasks
        return miniwob_tasks()
    from envs.osworld.env import bundled_tasks, slot_image
    return sorted(bundled_tasks(slot_image(spec)))
