"""The run directory: everything one run writes, in one place.

    runs/<name>/
      config.yaml          the resolved run config (what every role of this run read)
      logs/<role>.log      structured JSON lines, one file per role process
      metrics/<role>.jsonl metrics records, one file per role
      data/                the data manager's store (SQLite + screenshot blobs)
      checkpoints/         orbax checkpoints of the trainer
      export/              Hugging Face exports
"""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import time
from pathlib import Path
from typing import Any

from dart_jax.config.loader import UsageError

_SUBDIRS = ("logs", "metrics", "data", "checkpoints", "export")


@dataclasses.dataclass(frozen=True)
class RunDir:
    root: Path

    @classmethod
    def create(cls, root: str | Path, config_yaml: str | None = None) -> "RunDir":
        """Make the layout (idempotent); write the resolved config when given."""
        run = cls(Path(root))
        for path in (run.root, *(run.root / sub for sub in _SUBDIRS)):
            _mkdir_shared(path)
        if config_yaml is not None:
            run.config_path.write_text(config_yaml)
        return run

    @property
    def config_path(self) -> Path:
        return self.root / "config.yaml"

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def export(self) -> Path:
        return self.root / "export"

    def policy_dir(self, hf_dir: str = "") -> Path:
        """The run's policy: `hf_dir` (the config's policy.hf_dir), else the policy-init/ that
        `dart-jax run` builds; a UsageError (exit 2, never retried) when it holds no checkpoint
        or this user cannot read it."""
        path = Path(hf_dir) if hf_dir else self.root / "policy-init"
        try:
            with (path / "config.json").open("rb"):
                return path
        except (FileNotFoundError, NotADirectoryError):
            raise UsageError(f"no policy at {path} (no config.json): set policy.hf_dir or start "
                             "the run with `dart-jax run`") from None
        except OSError as e:  # another host's home, a 0700 share: a config error, not a crash to retry
            raise UsageError(f"the policy at {path} cannot be read by uid {os.geteuid()}: {e.strerror}") from None

    def log_path(self, role: str) -> Path:
        return self.root / "logs" / f"{role}.log"

    def metrics_path(self, role: str) -> Path:
        return self.root / "metrics" / f"{role}.jsonl"


def _mkdir_shared(path: Path) -> None:
    """A run directory other users of the run's group write too (a slice's hosts each have a uid
    of their own on the shared root): group-writable whatever the umask, made so by its owner."""
    path.mkdir(parents=True, exist_ok=True)
    got = path.stat()
    if got.st_uid == os.geteuid() and not got.st_mode & stat.S_IWGRP:
        path.chmod(got.st_mode | stat.S_IWGRP)


class MetricsWriter:
    """Appends one JSON object per record to metrics/<role>.jsonl (flushed per record) and,
    given `tensorboard_dir`, every numeric value as a TensorBoard scalar too."""

    def __init__(self, path: Path, tensorboard_dir: Path | None = None):
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("a", buffering=1)
        self._tb = None
        if tensorboard_dir is not None:
            from tensorboardX import SummaryWriter  # only where a writer keeps TensorBoard files
            self._tb = SummaryWriter(str(tensorboard_dir), flush_secs=10)

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        record = {"time": time.time(), "step": step, **{k: _plain(v) for k, v in metrics.items()}}
        self._file.write(json.dumps(record) + "\n")
        if self._tb is not None:
            for key, value in record.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and key not in ("time", "step"):
                    self._tb.add_scalar(key, value, step, walltime=record["time"])

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()


def _plain(value: Any) -> Any:
    """Scalars from numpy/JAX arrays; everything else as is."""
    if hasattr(value, "item") and getattr(value, "size", 1) == 1:
        return value.item()
    return value
