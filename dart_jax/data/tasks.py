"""The run's task list, from config: a JSONL file of TaskSpec objects and inline entries.

The data manager never imports the environments; whoever builds the task list (the env
package's task registry, a script) writes it as JSONL, one `wire.TaskSpec` per line.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import msgspec

from dart_jax.data.config import TaskEntry, TaskSourceConfig
from dart_jax.wire.messages import TaskSpec


def read_task_file(path: Path) -> list[TaskSpec]:
    specs = []
    for lineno, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            specs.append(msgspec.json.decode(line, type=TaskSpec))
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            raise ValueError(f"{path}:{lineno}: not a TaskSpec: {e}") from None
    return specs


def write_task_file(path: Path, specs: list[TaskSpec]) -> None:
    Path(path).write_bytes(b"".join(msgspec.json.encode(s) + b"\n" for s in specs))


def load_tasks(cfg: TaskSourceConfig, run_dir: Path) -> list[TaskSpec]:
    """All configured tasks (file first, then inline); duplicate task ids are an error."""
    specs = read_task_file(Path(run_dir) / cfg.task_file) if cfg.task_file else []
    specs += [_inline(i, e) for i, e in enumerate(cfg.tasks)]
    seen: set[str] = set()
    for s in specs:
        if s.task_id in seen:
            raise ValueError(f"task {s.task_id!r} is listed twice")
        seen.add(s.task_id)
    return specs


def _inline(index: int, entry: TaskEntry) -> TaskSpec:
    """A config entry checked as the wire checks a TaskSpec, so every task the data manager
    hands out decodes on the rollout side."""
    try:
        return msgspec.convert(dataclasses.asdict(entry), TaskSpec)
    except msgspec.ValidationError as e:
        raise ValueError(f"tasks.tasks[{index}]: {e}") from None
