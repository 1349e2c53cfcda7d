"""The live terminal view of `dart-jax run`.

    reader = RunReader(run_dir)
    with LiveView(total_steps=cfg.trainer_steps) as view:
        while running:
            view.update(snapshot(reader.refresh(), data_stats, [env_stats], now=time.time(), num_slots=16))
            time.sleep(2)

On a terminal it redraws one panel in place (rich Live); when stdout is not a terminal
(a log file, CI) it prints one compact line every `every_s` seconds of snapshot time.
A snapshot is plain values, so the view never touches the run itself.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
from typing import Mapping, Sequence

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table

from dart_jax.observe.learning import FALL, TAIL_VERSIONS, WINDOW, Collapse, detect_collapse
from dart_jax.observe.records import RunRecords, TrajectoryTiming
from dart_jax.observe.utilization import Window, extent, measure, staleness_counts, staleness_mean
from dart_jax.wire.messages import DataStats, EnvStats


@dataclasses.dataclass(frozen=True)
class Snapshot:
    time: float  # wall clock of the snapshot
    trainer_step: int  # optimizer steps done (the trainer's log lags one round)
    policy_version: int  # newest version the trainer published
    worker_versions: Mapping[str, int]  # the version each worker serves (-1: none yet)
    success: float | None  # over the last `recent` train rollouts (env errors left out)
    mean_reward: float | None
    recent: int
    trajectories: int
    unused: int | None  # fresh train rollouts waiting in the data manager
    batches: int
    staleness_mean: float | None  # trained steps of the last STALENESS_BATCHES batches
    staleness_max: int | None
    env: float | None  # utilization over the last `window_s` seconds (env servers': their own window)
    rollout: float | None
    trainer: float | None
    window_s: float  # shorter than asked in a run younger than that
    collapse: Collapse | None = None  # train rollouts' success fell below half of its best (learning.py)


STALENESS_BATCHES = 8


def snapshot(records: RunRecords, stats: DataStats | None = None, envs: Sequence[EnvStats] = (), *, now: float,
             num_slots: int, workers: Sequence[str] = (), window_s: float = 60.0, recent: int = 64) -> Snapshot:
    """What the view shows, from the run's records, the data manager's DataStats and the
    env servers' own EnvStats. Given EnvStats set the env-slot utilization (their busy time
    over their measurement window counts episodes still in flight, which records cannot);
    ask with `EnvStatsRequest(reset=True)` every `window_s` for a rolling figure."""
    rollouts = recent_rollouts(records, recent)
    counts = staleness_counts(records.batches[-STALENESS_BATCHES:])
    u = _utilization(records, now, num_slots, workers, window_s)
    versions = [r.policy_version for r in records.rounds[-1:]] + ([stats.latest_version] if stats else [])
    return Snapshot(
        time=now, trainer_step=records.rounds[-1].step if records.rounds else 0,
        policy_version=max(versions, default=-1), worker_versions=worker_versions(records, workers),
        success=_mean([float(t.success) for t in rollouts]), mean_reward=_mean([t.reward for t in rollouts]),
        recent=len(rollouts), trajectories=stats.trajectories if stats else len(records.trajectories),
        unused=sum(t.unused for t in stats.tasks if t.split == "train") if stats else None,
        batches=stats.batches if stats else len(records.batches),
        staleness_mean=staleness_mean(counts) if counts else None, staleness_max=max(counts, default=None),
        env=env_busy(envs) if any(e.slots for e in envs) else (u.env if u else None),
        rollout=u.rollout if u else None, trainer=u.trainer if u else None,
        window_s=u.window.seconds if u else window_s, collapse=detect_collapse(records.trajectories))


def recent_rollouts(records: RunRecords, n: int) -> list[TrajectoryTiming]:
    """The last `n` rollouts of train tasks, env errors left out."""
    return [t for t in records.trajectories[-4 * n:]
            if t.source == "rollout" and t.split == "train" and t.status != "env_error"][-n:]


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _utilization(records: RunRecords, now: float, num_slots: int, workers: Sequence[str], window_s: float):
    """Over the last `window_s` seconds, or since the first record in a younger run."""
    start = now - window_s
    trajs = records.trajectories
    if not (trajs and trajs[0].created_at < start):  # else the run is older than the window: no scan
        first = extent(records)
        if first is None or now <= first.start:
            return None
        start = max(start, first.start)
    return measure(records, Window(start, now), num_slots, workers)


def env_busy(envs: Sequence[EnvStats]) -> float:
    """Σ busy_s / Σ wall_s over every slot of the servers (each over its own measurement window)."""
    slots = [s for e in envs for s in e.slots]
    wall = sum(s.wall_s for s in slots)
    return sum(s.busy_s for s in slots) / wall if wall > 0 else 0.0


def worker_versions(records: RunRecords, workers: Sequence[str] = ()) -> dict[str, int]:
    """The newest version each worker is known to serve: its last successful weight sync,
    or the versions its latest rollouts were sampled at (versions only grow)."""
    out = {w: -1 for w in [*workers, *records.workers()]}
    for s in records.syncs:
        if s.ok:
            out[s.worker_id] = max(out[s.worker_id], s.version)
    for t in records.trajectories[-256:]:
        if t.source == "rollout" and t.steps:
            out[t.worker_id] = max(out[t.worker_id], *(s.policy_version for s in t.steps))
    return dict(sorted(out.items()))


class Rate:
    """Trainer steps per second over the last `horizon_s` seconds of snapshots."""

    def __init__(self, horizon_s: float = 300.0):
        self.horizon_s = horizon_s
        self.samples: collections.deque[tuple[float, int]] = collections.deque()

    def add(self, time: float, step: int) -> None:
        self.samples.append((time, step))
        while len(self.samples) > 2 and self.samples[1][0] <= time - self.horizon_s:
            self.samples.popleft()

    def per_s(self) -> float:
        (t0, s0), (t1, s1) = self.samples[0], self.samples[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 else 0.0


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def _clock(seconds: float | None) -> str:
    return "--:--" if seconds is None else str(datetime.timedelta(seconds=round(seconds)))


class LiveView:
    """`update(snapshot)` after each poll; use as a context manager (starts/stops the live panel)."""

    def __init__(self, total_steps: int, console: Console | None = None, every_s: float = 10.0,
                 budget_s: float | None = None):
        """`budget_s`: the trainer's wall-clock budget (`trainer.max_seconds`), counted from the
        first snapshot: the ETA is the sooner of the steps' and the budget's end."""
        if total_steps < 1:
            raise ValueError(f"total_steps must be at least 1, got {total_steps}")
        self.total_steps, self.every_s, self.budget_s = total_steps, every_s, budget_s
        self._first: float | None = None
        self.console = console or Console()
        self.rate = Rate()
        self._live: Live | None = None
        self._printed_at = float("-inf")

    def __enter__(self) -> "LiveView":
        if self.console.is_terminal:
            self._live = Live(console=self.console, auto_refresh=False)
            self._live.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def update(self, snap: Snapshot) -> None:
        self._first = snap.time if self._first is None else self._first
        self.rate.add(snap.time, snap.trainer_step)
        if self._live is not None:
            self._live.update(self.render(snap), refresh=True)
        elif snap.time - self._printed_at >= self.every_s:
            self._printed_at = snap.time
            self.console.print(self.line(snap), markup=False, highlight=False, soft_wrap=True)

    def eta_s(self, snap: Snapshot) -> float | None:
        rate = self.rate.per_s()
        steps = max(self.total_steps - snap.trainer_step, 0) / rate if rate > 0 else None
        if self.budget_s is None:
            return steps
        first = snap.time if self._first is None else self._first
        left = max(self.budget_s - (snap.time - first), 0.0)
        return left if steps is None else min(steps, left)

    def line(self, snap: Snapshot) -> str:
        """The compact form, one line: for logs."""
        workers = " ".join(f"{w}:{_version(v)}" for w, v in snap.worker_versions.items())
        return (f"step {snap.trainer_step}/{self.total_steps} ETA {_clock(self.eta_s(snap))} | "
                f"{_version(snap.policy_version)} [{workers}] | success {_pct(snap.success)} "
                f"reward {_num(snap.mean_reward)} (last {snap.recent}) | unused {_num(snap.unused)} "
                f"batches {snap.batches} staleness {_num(snap.staleness_mean)}/{_num(snap.staleness_max)} | "
                f"busy {snap.window_s:.0f}s: env {_pct(snap.env)} rollout {_pct(snap.rollout)} "
                f"trainer {_pct(snap.trainer)}" + (f" | {collapse_text(snap.collapse)}" if snap.collapse else ""))

    def render(self, snap: Snapshot) -> RenderableType:
        """The panel: progress with ETA, then one labelled row per concern."""
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="bold cyan", no_wrap=True)
        grid.add_column()
        for label, value in self._rows(snap):
            grid.add_row(label, value)
        return Panel(Group(self._progress(snap), grid), title="dart-jax run", title_align="left")

    def _progress(self, snap: Snapshot) -> RenderableType:
        bar = Table.grid(padding=(0, 1))
        bar.add_row(f"step {snap.trainer_step}/{self.total_steps}",
                    ProgressBar(total=self.total_steps, completed=snap.trainer_step, width=50),
                    f"{snap.trainer_step / self.total_steps:.0%}",
                    f"{self.rate.per_s() * 60:.1f} steps/min", f"ETA {_clock(self.eta_s(snap))}")
        return bar

    def _rows(self, snap: Snapshot) -> list[tuple[str, str]]:
        workers = "  ".join(f"{w} {_version(v)}" for w, v in snap.worker_versions.items()) or "-"
        return [
            ("policy", f"trainer {_version(snap.policy_version)}   workers: {workers}"),
            ("rollouts", f"success {_pct(snap.success)}   mean reward {_num(snap.mean_reward)}   "
                         f"(last {snap.recent} train rollouts)"),
            ("data", f"{snap.trajectories} trajectories   {_num(snap.unused)} fresh unused   "
                     f"{snap.batches} batches"),
            ("staleness", f"mean {_num(snap.staleness_mean)}   max {_num(snap.staleness_max)}   "
                          f"(last {STALENESS_BATCHES} batches)"),
            ("busy", f"env slots {_pct(snap.env)}   rollout {_pct(snap.rollout)}   trainer {_pct(snap.trainer)}   "
                     f"(last {snap.window_s:.0f} s)"),
        ] + ([("collapse", collapse_text(snap.collapse))] if snap.collapse else [])


def collapse_text(c: Collapse) -> str:
    if c.late:
        where, how = f"the rollouts of the last {TAIL_VERSIONS} versions", "under half of"
    else:
        where, how = f"the last {WINDOW} train rollouts", f"{FALL:.0%} or more below"
    return (f"COLLAPSED at {_version(c.version)}: success {_pct(c.success)} of {where}, "
            f"{how} its best {_pct(c.best)} ({_version(c.best_version)})")


def _version(v: int) -> str:
    return f"v{v}" if v >= 0 else "-"  # -1: no policy version yet


def _num(x: float | int | None) -> str:
    if x is None:
        return "-"
    return str(x) if isinstance(x, int) else f"{x:.2f}"
