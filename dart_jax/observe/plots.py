"""Pictures of a run: task success over time, what every part did when, staleness.

    paths = render(Path("runs/local"), slots=[...])   # runs/local/plots/{success,timeline,staleness}.png

Drawn with matplotlib's object API on the Agg canvas: no display, no pyplot state shared
with the caller's process. Time is wall-clock time since the run's first stamp.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from dart_jax.observe.records import Interval, RunReader, RunRecords, TrajectoryTiming
from dart_jax.observe.utilization import (Window, coverage, covered, env_calls, extent, generation_spans, slot_calls,
                                      staleness_counts, staleness_mean, trained_in, trainer_spans)

DPI = 120
WIDTH_IN = 12.0
BINS = 1200  # timeline columns: about one per pixel of the plot area
# One hue per role, dark for work and light for waiting, so a lane reads at a glance.
COLORS = {
    "waiting for a batch": "#d9d9d9", "updating": "#1f5fbf", "publishing": "#f28e2b",
    "generating": "#2e9b3e", "pulling weights (generation goes on)": "#c9a8e6", "loading weights (paused)": "#d62728",
    "leased, waiting on the model": "#a8dcd6", "env call": "#1b7f79",
}  # in lane order: the legend's columns are the trainer's, the workers' and the slots' states


def render(run_dir: Path, slots: Sequence[str] = (), records: RunRecords | None = None) -> list[Path]:
    """Write the three plots under `run_dir`/plots/ and return their paths. `slots`: every
    env slot ("ENDPOINT#SLOT") of the run, so idle ones get a lane too; `records`: what a
    caller already read (default: read the run directory now)."""
    if records is None:
        reader = RunReader(Path(run_dir))
        records = reader.refresh()
        reader.close()
    out = Path(run_dir) / "plots"
    out.mkdir(parents=True, exist_ok=True)
    clock = Clock.of(records)
    return [_save(success_figure(records), out / "success.png"),
            _save(timeline_figure(records, clock, slots), out / "timeline.png"),
            _save(staleness_figure(records, clock), out / "staleness.png")]


def _save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, dpi=DPI)
    return path


@dataclasses.dataclass(frozen=True)
class Clock:
    """Wall-clock seconds to plot units since the run's first stamp (minutes past 3 of them)."""
    window: Window
    per_unit: float
    unit: str

    @classmethod
    def of(cls, records: RunRecords, evals: bool = False) -> "Clock":
        """From the first stamp to the last; `evals`: the evaluations' stamps too (the one
        after RL ends after the run's last rollout: a window without it cuts its point off)."""
        stamps = [e.time for e in records.evals] if evals else []
        if (recorded := extent(records)) is not None:
            stamps += [recorded.start, recorded.end]
        window = Window(min(stamps), max(max(stamps), min(stamps) + 1.0)) if stamps else Window(0.0, 1.0)
        return cls(window, 60.0, "min") if window.seconds > 180 else cls(window, 1.0, "s")

    def x(self, t: float) -> float:
        return (t - self.window.start) / self.per_unit

    def label(self) -> str:
        return f"wall time since the run's first record ({self.unit})"


def _empty(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="gray")


# ---- (a) success -------------------------------------------------------------------------------

def rolling_success(trajs: Sequence[TrajectoryTiming]) -> tuple[list[float], list[float], int]:
    """(end times, rolling success, k): the success rate of the last k train rollouts at
    each one's end, env errors left out, from the k-th on (all of them while fewer); k grows
    with the run, 5 to 100."""
    runs = sorted((t for t in trajs if t.source == "rollout" and t.split == "train" and t.status != "env_error"),
                  key=lambda t: t.created_at)
    k = max(5, min(100, len(runs) // 10))
    wins = [float(t.success) for t in runs]
    ends = range(max(1, min(k, len(runs))), len(runs) + 1)
    return [runs[e - 1].created_at for e in ends], [sum(wins[max(0, e - k):e]) / min(k, e) for e in ends], k


def success_figure(records: RunRecords) -> Figure:
    """Train rollouts' rolling success, every held-out evaluation (the one after RL too: the
    time axis runs to the last evaluation) and the policy versions published."""
    clock = Clock.of(records, evals=True)
    fig = Figure(figsize=(WIDTH_IN, 4.5), layout="constrained")
    ax = fig.add_subplot()
    times, rates, k = rolling_success(records.trajectories)
    if times:
        ax.plot([clock.x(t) for t in times], rates, color="#2e9b3e", lw=1.6,
                label=f"train rollouts (mean of the last {k})")
    _held_out(ax, records, clock)
    _versions(ax, records, clock)
    if not times and not records.evals:
        _empty(ax, "no rollouts of train tasks and no evaluations yet")
    end = clock.x(clock.window.end)  # a margin: the last evaluation sits at the window's end
    ax.set(xlim=(0, 1.03 * end), ylim=(-0.02, 1.02), xlabel=clock.label(),
           ylabel="task success rate", title="Task success")
    ax.grid(alpha=0.3)
    handles = [h for a in fig.axes for h in a.get_legend_handles_labels()[0]]
    if handles:  # below the axes: over them it would hide the curve
        fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), fontsize=9, frameon=False)
    return fig


def _held_out(ax: Axes, records: RunRecords, clock: Clock) -> None:
    """Each mode's evaluations: success with its 95% interval; greedy ones nudged right so
    the intervals stay apart, each evaluation named once by its label."""
    nudge = 0.006 * clock.x(clock.window.end)
    for mode, marker, color, dx in (("sampled", "o", "#1f5fbf", 0.0), ("greedy", "D", "#8c6bb1", nudge)):
        evals = [e for e in records.evals if e.mode == mode]
        if not evals:
            continue
        xs, ys = [clock.x(e.time) + dx for e in evals], [e.success for e in evals]
        errs = [[e.success - e.ci95[0] for e in evals], [e.ci95[1] - e.success for e in evals]]
        ax.errorbar(xs, ys, yerr=errs, fmt=marker, color=color, mfc="white" if mode == "greedy" else None,
                    capsize=4, label=f"held-out tasks, {mode} (95% interval)")
    named = {e.label: e for e in reversed(records.evals)}  # the sampled result where there is one
    for e in named.values():
        ax.annotate(e.label, (clock.x(e.time), e.success), textcoords="offset points", xytext=(-6, 4),
                    ha="right", fontsize=8, color="#1f5fbf")


def _versions(ax: Axes, records: RunRecords, clock: Clock) -> None:
    """The policy version the trainer published, as a staircase on a right-hand axis."""
    if not records.rounds:
        return
    first = records.rounds[0]
    times = [first.fetch_start] + [r.publish_end for r in records.rounds]
    versions = [first.policy_version - 1] + [r.policy_version for r in records.rounds]
    right = ax.twinx()
    right.step([clock.x(t) for t in times], versions, where="post", color="gray", alpha=0.6, lw=1,
               label="policy version published (right axis)")
    right.set_ylabel("policy version", color="gray")
    right.tick_params(axis="y", colors="gray")
    right.set_ylim(bottom=0)


# ---- (b) activity timeline ------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Lane:
    group: str  # "trainer", "workers" or "slots": a rule separates the groups
    label: str
    layers: tuple[tuple[str, tuple[Interval, ...], float], ...]  # (state, spans, bar height 0..1), drawn in order
    busy: float  # utilization over the run, for the label


def trainer_lane(records: RunRecords, window: Window) -> list[Lane]:
    rounds = records.rounds
    if not rounds:
        return []
    layers = (("waiting for a batch", tuple((r.fetch_start, r.update_start) for r in rounds), 1.0),
              ("updating", tuple((r.update_start, r.publish_start) for r in rounds), 1.0),
              ("publishing", tuple((r.publish_start, r.publish_end) for r in rounds), 1.0))
    return [Lane("trainer", "trainer", layers, covered(trainer_spans(rounds), window) / window.seconds)]


def worker_lanes(records: RunRecords, window: Window) -> list[Lane]:
    gen = generation_spans(records.trajectories, records.syncs)
    lanes = []
    for worker in records.workers():
        syncs = [s for s in records.syncs if s.worker_id == worker and s.ok]
        layers = (("generating", tuple(gen.get(worker, ())), 1.0),
                  ("pulling weights (generation goes on)", tuple((s.started, s.paused) for s in syncs), 0.3),
                  ("loading weights (paused)", tuple((s.paused, s.resumed) for s in syncs), 1.0))
        lanes.append(Lane("workers", f"worker {worker}", layers, covered(gen.get(worker, ()), window) / window.seconds))
    return lanes


def slot_lanes(records: RunRecords, window: Window, slots: Sequence[str]) -> list[Lane]:
    calls = slot_calls(records.trajectories)
    episodes: dict[str, list[Interval]] = {}
    for t in records.trajectories:
        ends = [b for _, b in env_calls(t) if b > 0]
        if t.env_slot and ends:
            episodes.setdefault(t.env_slot, []).append((t.reset_s[0], max(ends)))
    names = sorted(set(slots) | set(calls), key=_slot_key)
    lanes = []
    for name in names:
        layers = (("leased, waiting on the model", tuple(episodes.get(name, ())), 1.0),
                  ("env call", tuple(calls.get(name, ())), 1.0))
        busy = covered(calls.get(name, ()), window) / window.seconds
        lanes.append(Lane("slots", slot_label(name, names), layers, busy))
    return lanes


def _slot_key(name: str) -> tuple[str, int]:
    endpoint, _, slot = name.rpartition("#")
    return endpoint, int(slot) if slot.isdigit() else -1


def slot_label(name: str, names: Sequence[str]) -> str:
    """"slot 3" when every slot is on one env server, else "env 1 #3" (servers numbered in order)."""
    endpoints = sorted({n.rpartition("#")[0] for n in names})
    endpoint, _, slot = name.rpartition("#")
    return f"slot {slot}" if len(endpoints) == 1 else f"env {endpoints.index(endpoint)} #{slot}"


def timeline_figure(records: RunRecords, clock: Clock, slots: Sequence[str] = ()) -> Figure:
    w = clock.window
    lanes = trainer_lane(records, w) + worker_lanes(records, w) + slot_lanes(records, w, slots)
    fig = Figure(figsize=(WIDTH_IN, 1.6 + 0.3 * max(len(lanes), 3)), layout="constrained")
    ax = fig.add_subplot()
    right = clock.x(w.end)
    for row, lane in enumerate(lanes):
        for state, spans, height in lane.layers:
            ax.imshow(_shade(COLORS[state], coverage(spans, w, BINS)), aspect="auto", interpolation="nearest",
                      extent=(0, right, row + 0.4, row + 0.4 - 0.8 * height), zorder=1)  # above the grid
    _lane_axes(ax, lanes, clock)
    return fig


def _shade(color: str, share_B: np.ndarray) -> np.ndarray:
    """A one-row RGBA image [1, B, 4]: the state's color, as opaque as the share of each bin
    it fills. Spans far shorter than a pixel (env steps in an hour-long run) then show as
    the lighter tint of their share, where drawn outlines would paint the lane solid."""
    rgba = np.empty((1, len(share_B), 4))
    rgba[..., :3] = to_rgb(color)
    rgba[..., 3] = share_B
    return rgba


def _lane_axes(ax: Axes, lanes: Sequence[Lane], clock: Clock) -> None:
    ax.set_xlabel(clock.label())
    if not lanes:
        _empty(ax, "no activity recorded yet")
        return
    ax.set_yticks(range(len(lanes)), [f"{lane.label}  {lane.busy:4.0%}" for lane in lanes], fontsize=8)
    ax.set_ylim(len(lanes) - 0.5, -0.5)  # the first lane on top
    ax.set_xlim(0, clock.x(clock.window.end))
    ax.grid(axis="x", alpha=0.3)
    for row in range(1, len(lanes)):
        if lanes[row].group != lanes[row - 1].group:
            ax.axhline(row - 0.5, color="black", lw=0.6)
    drawn = {state for lane in lanes for state, spans, _ in lane.layers if spans}
    used = [s for s in COLORS if s in drawn]
    ax.legend([Patch(color=COLORS[s]) for s in used], used, loc="lower left", bbox_to_anchor=(0, 1.0), ncol=3,
              fontsize=8, frameon=False, alignment="left", title_fontsize=9,
              title="What each lane did (shade: share of the time; labels: busy share of the run)")


# ---- (c) staleness ----------------------------------------------------------------------------------

def staleness_figure(records: RunRecords, clock: Clock) -> Figure:
    trained = trained_in(records.rounds, records.batches, clock.window)
    counts = staleness_counts(trained)
    fig = Figure(figsize=(7.0, 4.0), layout="constrained")
    ax = fig.add_subplot()
    total = sum(counts.values())
    if total:
        bars = ax.bar(list(counts), list(counts.values()), color="#1f5fbf", width=0.7)
        ax.bar_label(bars, [f"{n} ({n / total:.0%})" for n in counts.values()], fontsize=8)
        ax.set_xticks(list(counts))
        ax.margins(y=0.12)  # room for the labels above the bars
        ax.set_title(f"Staleness of trained steps: mean {staleness_mean(counts):.2f}, max {max(counts)}, "
                     f"{total} steps in {len(trained)} trained batches", fontsize=10)
    else:
        _empty(ax, "no trained batches yet")
    ax.set(xlabel="staleness = trainer's policy version - sampling version (pool injections left out)",
           ylabel="trained steps")
    ax.grid(axis="y", alpha=0.3)
    return fig
