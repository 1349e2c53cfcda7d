"""The run's tasks (suites of train and eval seeds) and its demonstration settings."""

from __future__ import annotations

import dataclasses
import json

from dart_jax.config.loader import bounded
from dart_jax.wire.messages import TaskSpec


@dataclasses.dataclass(frozen=True)
class TaskSuite:
    """Task instances of one backend: each name with seeds 0..train_seeds-1 for training
    and eval_seed_base.. for evaluation (disjoint, so evaluation never sees a train seed).
    `config` goes to every task of the suite (the backend's settings, e.g. the synthetic
    suite's `difficulty` and `words`; the env server checks them when it resets a task)."""
    backend: str
    names: tuple[str, ...]
    train_seeds: int = bounded(8, ge=0)
    eval_seeds: int = bounded(2, ge=0)
    eval_seed_base: int = bounded(10_000, ge=0)
    config: dict[str, int] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.eval_seeds and self.eval_seed_base < self.train_seeds:
            raise ValueError(f"eval seeds from {self.eval_seed_base} overlap train seeds 0..{self.train_seeds - 1}")

    def specs(self) -> list[TaskSpec]:
        seeds = [(s, "train") for s in range(self.train_seeds)]
        seeds += [(self.eval_seed_base + s, "eval") for s in range(self.eval_seeds)]
        config = json.dumps(self.config, sort_keys=True) if self.config else ""
        return [TaskSpec(task_id=f"{self.backend}/{name}/{seed}", backend=self.backend, name=name,
                         seed=seed, split=split, config=config) for name in self.names for seed, split in seeds]


@dataclasses.dataclass(frozen=True)
class JobConfig:
    """The run's task suites (written to the task file the data manager loads), and how the
    `demos` phase plays the oracle on them."""
    suites: tuple[TaskSuite, ...] = (
        TaskSuite(backend="synthetic", names=("click-button", "enter-text", "check-boxes",
                                              "select-item", "form")),)
    demo_max_steps: int = bounded(15, ge=1)
    demo_concurrency: int = bounded(4, ge=1)

    def tasks(self) -> list[TaskSpec]:
        """Every task, train before eval, the task lists of all suites and names interleaved
        in proportion to their lengths. The scheduler hands out untried tasks in list order,
        so a run shorter than one pass over the train tasks still trains on every suite."""
        streams = [[s for s in suite.specs() if s.name == name] for suite in self.suites for name in suite.names]
        return [spec for split in ("train", "eval")
                for spec in _interleave([[s for s in stream if s.split == split] for stream in streams])]


def _interleave(streams: list[list[TaskSpec]]) -> list[TaskSpec]:
    """The streams merged so that each one's i-th item sits at the fraction (i + 1/2) / len of
    the whole (ties: the earlier stream first)."""
    ranked = [((i + 0.5) / len(stream), k, i) for k, stream in enumerate(streams) for i in range(len(stream))]
    return [streams[k][i] for _, k, i in sorted(ranked)]
