"""Config of the data manager: its wire link, its store, the curation rules, its tasks.

    cfg = load(DataManagerConfig, "configs/local.yaml")   # or a section of the run config
    dart_jax.data.service.run(cfg, Path("runs/local"))

Paths are relative to the run directory unless absolute (`~` is the user's home).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Literal

from dart_jax.config import bounded
from dart_jax.wire import WireConfig


@dataclasses.dataclass(frozen=True)
class StoreConfig:
    """SQLite (WAL) database plus a content-addressed blob directory for screenshots.

    `durability: process` survives a killed process (WAL, synchronous=NORMAL, screenshots
    appended to the blob packs before the commit); `power` also survives power loss
    (synchronous=FULL, the packs fsynced before each group commit).
    """
    db_path: str = "data/store.sqlite"
    blob_dir: str = "data/blobs"
    durability: Literal["process", "power"] = "process"
    group_commit_max: int = bounded(256, ge=1)  # trajectories per transaction, at most
    handler_threads: int = bounded(8, ge=1)  # request handlers (ingest hashes and appends screenshots here)

    def db_file(self, run_dir: str | Path) -> Path:
        return Path(run_dir) / Path(self.db_path).expanduser()


@dataclasses.dataclass(frozen=True)
class CurationConfig:
    """DART's curation rules (formulas in `dart_jax.data.curation`)."""
    # Dynamic rollout count: s < low_success -> max_rollouts, else
    # clamp(floor(numerator / s - offset), min_rollouts, max_rollouts).
    low_success: float = bounded(0.6, gt=0, le=1)
    numerator: float = bounded(9.0, gt=0)
    offset: float = 7.0
    min_rollouts: int = bounded(1, ge=1)
    max_rollouts: int = bounded(8, ge=1)
    success_window: int = bounded(16, ge=1)  # recent rollout attempts that define s
    # Dynamic trajectory length: clamp(ceil(p-th percentile of successful lengths + margin)).
    length_percentile: float = bounded(90.0, gt=0, le=100)
    length_margin: int = bounded(2, ge=0)
    length_window: int = bounded(64, ge=1)  # most recent successes considered
    min_steps: int = bounded(3, ge=1)
    max_steps: int = bounded(30, ge=1)
    default_max_steps: int = bounded(30, ge=1)  # before the task's first success
    # Batches: tasks_per_batch GRPO groups of at most group_size trajectories.
    tasks_per_batch: int = bounded(8, ge=1)
    group_size: int = bounded(8, ge=2)
    max_staleness: int = bounded(1, ge=0)  # trainer version - oldest sampling version
    # Experience pool: a group without a success takes one stored success of its task
    # (demonstrations, earlier rollouts); off: a group's success must be one of its own.
    experience_pool: bool = True
    keep_all_success_groups: bool = False  # zero-advantage groups; waiting gives a failure a chance
    # Scheduling: no task is handed out while every task already has this many rollouts
    # in flight or waiting unused (back-pressure against stale data).
    max_pending_per_task: int = bounded(16, ge=1)
    # ... nor while the whole run has this many that a batch can take (0: no such cap):
    # back-pressure for many tasks and a trainer slower than the fleet (a few shared CPU cores)
    max_pending: int = bounded(0, ge=0)
    # A fixed task set visited again and again (DART's regime): only train tasks with seed <
    # rl_seeds are handed out to rollouts and batched; the other train seeds still give the
    # demos phase its demonstrations. 0: every train task (a run then rarely revisits one).
    rl_seeds: int = bounded(0, ge=0)
    assignment_timeout_s: float = bounded(900.0, gt=0)  # an in-flight rollout counts this long
    worker_timeout_s: float = bounded(30.0, gt=0)  # a silent worker's assignments return after this

    def __post_init__(self) -> None:
        if self.min_rollouts > self.max_rollouts:
            raise ValueError(f"min_rollouts {self.min_rollouts} > max_rollouts {self.max_rollouts}")
        if not self.min_steps <= self.default_max_steps <= self.max_steps:
            raise ValueError(f"need min_steps <= default_max_steps <= max_steps, got "
                             f"{self.min_steps}, {self.default_max_steps}, {self.max_steps}")


@dataclasses.dataclass(frozen=True)
class TaskEntry:
    """A task written inline in the config (the fields of `wire.TaskSpec`)."""
    task_id: str
    backend: str
    name: str
    seed: int = 0
    split: Literal["train", "eval"] = "train"
    config: str = ""


@dataclasses.dataclass(frozen=True)
class TaskSourceConfig:
    """Where the task list comes from: a JSONL file of TaskSpec objects and/or inline
    entries. A task keeps its split for the life of the run (the store refuses a change)."""
    task_file: str = ""
    tasks: tuple[TaskEntry, ...] = ()


@dataclasses.dataclass(frozen=True)
class PoolConfig:
    """Pre-collected successes imported at start (directories of *.traj or *.jsonl files);
    importing is idempotent by trajectory id."""
    import_paths: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class RequestPathsConfig:
    """Where the paths that requests name may point besides the run directory: PoolImport
    reads under `import_roots`, ExportTrajectories writes under `export_roots`. A request's
    relative path is taken in the run directory; an absolute one must resolve inside the
    run directory or one of these roots; nothing else is reachable from the wire."""
    import_roots: tuple[str, ...] = ()
    export_roots: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class DataManagerConfig:
    wire: WireConfig = WireConfig(endpoint="tcp://127.0.0.1:5557")
    store: StoreConfig = StoreConfig()
    curation: CurationConfig = CurationConfig()
    tasks: TaskSourceConfig = TaskSourceConfig()
    pool: PoolConfig = PoolConfig()
    request_paths: RequestPathsConfig = RequestPathsConfig()


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


@dataclasses.dataclass(frozen=True)
class TasksConfig:
    """The run's task suites (the `tasks:` section; `job:` is its old name): `dart-jax run`
    writes them to the task file the data manager loads (`data.tasks.task_file`), and the
    `demos` phase plays the oracle on them as these settings say."""
    suites: tuple[TaskSuite, ...] = (
        TaskSuite(backend="synthetic", names=("click-button", "enter-text", "check-boxes",
                                              "select-item", "form")),)
    demo_max_steps: int = bounded(15, ge=1)
    demo_concurrency: int = bounded(4, ge=1)
