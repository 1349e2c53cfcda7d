"""The run's task list, from config: a JSONL file of TaskSpec objects and inline entries.

The data manager never imports the environments; whoever builds the task list (the env
package's task registry, a script) writes it as JSONL, one `wire.TaskSpec` per line.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import msgspec

from dart_jax.data.config import TaskEntry, TaskSourceConfig, TasksConfig, TaskSuite
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


def suite_specs(suite: TaskSuite) -> list[TaskSpec]:
    """The suite's task instances: each name with its train seeds, then its eval seeds."""
    seeds = [(s, "train") for s in range(suite.train_seeds)]
    seeds += [(suite.eval_seed_base + s, "eval") for s in range(suite.eval_seeds)]
    config = json.dumps(suite.config, sort_keys=True) if suite.config else ""
    return [TaskSpec(task_id=f"{suite.backend}/{name}/{seed}", backend=suite.backend, name=name,
                     seed=seed, split=split, config=config) for name in suite.names for seed, split in seeds]


def suite_tasks(cfg: TasksConfig) -> list[TaskSpec]:
    """Every task of the run's suites, train before eval, the task lists of all suites and
    names interleaved in proportion to their lengths. The scheduler hands out untried tasks in
    list order, so a run shorter than one pass over the train tasks still trains on every suite."""
    streams = [[s for s in suite_specs(suite) if s.name == name] for suite in cfg.suites for name in suite.names]
    return [spec for split in ("train", "eval")
            for spec in _interleave([[s for s in stream if s.split == split] for stream in streams])]


def _interleave(streams: list[list[TaskSpec]]) -> list[TaskSpec]:
    """The streams merged so that each one's i-th item sits at the fraction (i + 1/2) / len of
    the whole (ties: the earlier stream first)."""
    ranked = [((i + 0.5) / len(stream), k, i) for k, stream in enumerate(streams) for i in range(len(stream))]
    return [streams[k][i] for _, k, i in sorted(ranked)]
