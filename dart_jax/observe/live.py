"""What `dart-jax run` shows while the roles run, and what it draws at the end.

The supervisor calls `Watcher.tick()` about once a second: every `period_s` it reads what
the run recorded since the last time (dart_jax.observe.records), asks the data manager for
its statistics and the env servers for theirs, and updates the view (dart_jax.observe.view: a
live panel on a terminal, a line every few seconds elsewhere). `plots()` renders the
run's PNGs (dart_jax.observe.plots) from the same records.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from pathlib import Path

from rich.console import Console

from dart_jax.rundir import RunDir
from dart_jax.observe.plots import render
from dart_jax.observe.records import RunReader
from dart_jax.observe.view import LiveView, snapshot
from dart_jax.wire import Client, RemoteError, WireConfig, WireTimeout
from dart_jax.wire.messages import DataStats, EnvStats, EnvStatsRequest, StatsRequest


ENV_WINDOW_S = 60.0


class Watcher:
    def __init__(self, cfg, run: RunDir, period_s: float = 2.0):
        self.cfg, self.run, self.period_s = cfg, run, period_s
        self.reader = RunReader(run.root, cfg.data.store.db_path)
        self.envs = cfg.env_wires()
        self.slots = [f"{w.endpoint}#{i}" for w in self.envs for i in range(sum(s.count for s in cfg.envs.slots))]
        self.workers = [f"rollout-{i}" for s in cfg.run.placement if s.role == "rollout" for i in range(s.count)]
        console = Console(force_terminal=False) if cfg.run.view == "lines" else None
        self.view = LiveView(cfg.trainer.steps, console=console, budget_s=cfg.trainer.max_seconds) \
            if cfg.run.view != "off" else None
        self._stack = contextlib.ExitStack()
        if self.view is not None:
            self._stack.enter_context(self.view)
        self._last = self._env_window = 0.0

    def tick(self) -> None:
        if self.view is None or time.monotonic() - self._last < self.period_s:
            return
        self._last = time.monotonic()
        records = self.reader.refresh()
        stats = _ask(self.cfg.data.wire, StatsRequest(), DataStats)
        new_window = time.monotonic() - self._env_window >= ENV_WINDOW_S  # env slots: the last minute
        self._env_window = self._last if new_window else self._env_window
        envs = [s for w in self.envs if (s := _ask(w, EnvStatsRequest(reset=new_window), EnvStats)) is not None]
        self.view.update(snapshot(records, stats, envs, now=time.time(), num_slots=len(self.slots),
                                  workers=self.workers))

    def plots(self) -> list[Path]:
        return render(self.run.root, slots=self.slots, records=self.reader.refresh())

    def close(self) -> None:
        self._stack.close()
        self.reader.close()


def _ask(wire: WireConfig, request, kind):
    """The server's answer, or None when it is not there right now (restarting)."""
    try:
        with Client(dataclasses.replace(wire, timeout_s=2.0)) as client:
            reply = client.request(request)
        return reply if isinstance(reply, kind) else None
    except (WireTimeout, RemoteError):
        return None
