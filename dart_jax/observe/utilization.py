"""How busy each part of a run was: the same computation for asynchronous and synchronous runs.

    u = measure(records, Window(t0, t1), num_slots=16)   # records: dart_jax.observe.records
    u.env, u.rollout, u.trainer, u.actions_per_min, u.staleness

Every figure is measured over a window W = [start, end) of wall-clock time from the
records alone (the wall-clock stamps the roles write), so the benchmark compares the
decoupled and the synchronous loop like for like (DART's "System" figures: environment
utilization, rollout utilization, trained actions per minute). Notation: |S| is the
total length of a set of intervals S with overlaps counted once (the length of their
union), S ∩ W the intervals clipped to W.

Records arrive when an episode is acknowledged, so a window ending now misses the
episodes still in flight: live figures read low by about one episode's length.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Iterable, Mapping, Sequence

import numpy as np

from dart_jax.observe.records import BatchRecord, Interval, RunRecords, TrainerRound, TrajectoryTiming, WorkerSync


@dataclasses.dataclass(frozen=True)
class Window:
    start: float
    end: float

    def __post_init__(self) -> None:
        if not self.end > self.start:
            raise ValueError(f"an empty measurement window: [{self.start}, {self.end})")

    @property
    def seconds(self) -> float:
        return self.end - self.start


def merge(spans: Iterable[Interval], window: Window | None = None) -> list[Interval]:
    """∪ spans (∩ W when a window is given) as sorted disjoint intervals; empty spans dropped."""
    lo, hi = (window.start, window.end) if window else (float("-inf"), float("inf"))
    clipped = sorted((max(a, lo), min(b, hi)) for a, b in spans if min(b, hi) > max(a, lo))
    out: list[Interval] = []
    for a, b in clipped:
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def subtract(spans: Iterable[Interval], holes: Iterable[Interval]) -> list[Interval]:
    """∪ spans minus ∪ holes, as sorted disjoint intervals (one pass over both, merged)."""
    holes, out, j = merge(holes), [], 0
    for a, b in merge(spans):
        while j < len(holes) and holes[j][1] <= a:
            j += 1
        k = j
        while k < len(holes) and holes[k][0] < b:
            if holes[k][0] > a:
                out.append((a, holes[k][0]))
            a, k = max(a, holes[k][1]), k + 1
        if a < b:
            out.append((a, b))
    return out


def covered(spans: Iterable[Interval], window: Window) -> float:
    """|spans ∩ W|: seconds of the window inside at least one span."""
    return sum(b - a for a, b in merge(spans, window))


def coverage(spans: Iterable[Interval], window: Window, bins: int) -> np.ndarray:
    """c_i = |spans ∩ B_i| / |B_i| for the `bins` equal slices B_i of W: float [bins].

    With F(x) = |spans ∩ [W.start, x)|, c_i = (F(e_{i+1}) - F(e_i)) / |B_i| at the bin edges
    e; F comes from the merged spans' cumulative lengths, so the cost is O(n log n + bins).
    """
    merged = np.array(merge(spans, window), dtype=np.float64).reshape(-1, 2)
    edges = np.linspace(window.start, window.end, bins + 1)
    lengths = merged[:, 1] - merged[:, 0]
    before = np.concatenate([[0.0], np.cumsum(lengths)])  # covered length before span k
    k = np.searchsorted(merged[:, 0], edges, side="right") - 1  # last span starting at or before e
    j = k.clip(0, None)
    inside = np.minimum(edges - merged[j, 0], lengths[j]) if len(merged) else np.zeros_like(edges)
    covered_to = np.where(k >= 0, before[j] + inside, 0.0)
    return np.diff(covered_to) / np.diff(edges)


# ---- env slots ------------------------------------------------------------------------------

def env_calls(traj: TrajectoryTiming) -> list[Interval]:
    """An episode's time inside env calls: its reset, each step's env step, its evaluation."""
    return [traj.reset_s, *(s.env_s for s in traj.steps), traj.evaluate_s]


def slot_calls(trajs: Iterable[TrajectoryTiming]) -> dict[str, list[Interval]]:
    """Env-call spans per slot ("ENDPOINT#SLOT"); trajectories not played on a slot are skipped."""
    out: dict[str, list[Interval]] = collections.defaultdict(list)
    for t in trajs:
        if t.env_slot:
            out[t.env_slot] += env_calls(t)
    return dict(out)


def env_utilization(trajs: Iterable[TrajectoryTiming], window: Window, num_slots: int) -> float:
    """U_env = Σ_slot |busy(slot) ∩ W| / (num_slots · |W|).

    busy(slot) = the env calls (reset, steps, evaluation) of every episode played on the
    slot. `num_slots` is every slot of the run: an idle slot has no trajectories to be seen
    by, yet it counts in the denominator.
    """
    if num_slots < 1:
        raise ValueError(f"num_slots must be at least 1, got {num_slots}")
    busy = {slot: covered(spans, window) for slot, spans in slot_calls(trajs).items()}
    active = sum(b > 0 for b in busy.values())
    if active > num_slots:
        raise ValueError(f"{active} slots were busy in the window but the run has num_slots={num_slots}")
    return sum(busy.values()) / (num_slots * window.seconds)


# ---- rollout workers -----------------------------------------------------------------------------

def generation_spans(trajs: Iterable[TrajectoryTiming], syncs: Iterable[WorkerSync] = ()) -> dict[str, list[Interval]]:
    """Per worker: when its engine was generating, as sorted disjoint intervals.

    gen(w) = ∪ gen_s of the steps of w's rollouts, minus the spans in which a weight load
    paused w's engine ([paused, resumed) of its successful syncs): requests frozen for a
    load stay in flight, but nothing is generated.
    """
    spans: dict[str, list[Interval]] = collections.defaultdict(list)
    for t in trajs:
        if t.source == "rollout":
            spans[t.worker_id] += [s.gen_s for s in t.steps]
    paused: dict[str, list[Interval]] = collections.defaultdict(list)
    for s in syncs:
        if s.ok:
            paused[s.worker_id].append((s.paused, s.resumed))
    return {w: subtract(gen, paused[w]) for w, gen in spans.items()}


def rollout_utilization(trajs: Iterable[TrajectoryTiming], syncs: Iterable[WorkerSync], window: Window,
                        workers: Sequence[str]) -> dict[str, float]:
    """U_w = |gen(w) ∩ W| / |W| for each worker w in `workers` (gen: `generation_spans`).

    U_w is the fraction of the window in which w's engine had at least one request
    generating (an engine busy fraction, not a device counter). A worker without rollouts
    in the window has U_w = 0.
    """
    spans = generation_spans(trajs, syncs)
    return {w: covered(spans.get(w, ()), window) / window.seconds for w in workers}


# ---- trainer ---------------------------------------------------------------------------------------

def trainer_spans(rounds: Iterable[TrainerRound]) -> list[Interval]:
    """What the trainer works on: each round's update and publish, [update_start, publish_end)."""
    return [(r.update_start, r.publish_end) for r in rounds]


def trainer_utilization(rounds: Iterable[TrainerRound], window: Window) -> float:
    """U_trainer = |∪_r [update_start_r, publish_end_r) ∩ W| / |W| (waiting for a batch is idle)."""
    return covered(trainer_spans(rounds), window) / window.seconds


def trained_in(rounds: Iterable[TrainerRound], batches: Iterable[BatchRecord], window: Window) -> list[BatchRecord]:
    """The batch of every round whose update ended (publish_start) inside W, one per round
    (a resumed trainer that trains a replayed batch again counts it again)."""
    by_id = {b.batch_id: b for b in batches}
    done = [r for r in rounds if window.start <= r.publish_start < window.end]
    missing = [r.batch_id for r in done if r.batch_id not in by_id]
    if missing:
        raise KeyError(f"the trainer trained batches the store does not hold: {missing[:5]}")
    return [by_id[r.batch_id] for r in done]


def actions_per_minute(trained: Sequence[BatchRecord], window: Window) -> float:
    """A = Σ_{batches b trained in W} steps(b) / (|W| / 60 s).

    steps(b) counts every step of b's trajectories, injected pool successes included: the
    trainer consumes them all.
    """
    return sum(b.steps for b in trained) / (window.seconds / 60.0)


def staleness_counts(trained: Iterable[BatchRecord]) -> dict[int, int]:
    """{k: number of trained steps with staleness k}, k = v_trainer(b) - v_sample(step).

    v_trainer(b) is the version the trainer held when batch b was made (the one whose
    update it feeds); v_sample the version that sampled the step. Injected pool successes
    are left out: their age says nothing about the loop.
    """
    return dict(sorted(collections.Counter(k for b in trained for k in b.staleness).items()))


def staleness_mean(counts: Mapping[int, int]) -> float:
    """Σ_k k · n_k / Σ_k n_k (0 when nothing was trained)."""
    total = sum(counts.values())
    return sum(k * n for k, n in counts.items()) / total if total else 0.0


# ---- one window, every figure -------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Utilization:
    window: Window
    env: float  # U_env
    rollout: float  # mean over the run's workers of U_w
    per_worker: dict[str, float]
    trainer: float  # U_trainer
    actions_per_min: float
    staleness: dict[int, int]  # over the batches trained in the window

    @property
    def staleness_mean(self) -> float:
        return staleness_mean(self.staleness)

    @property
    def staleness_max(self) -> int:
        return max(self.staleness, default=0)


def measure(records: RunRecords, window: Window, num_slots: int, workers: Sequence[str] = ()) -> Utilization:
    """Every figure over one window. `workers`: every worker id of the run (default: those
    seen in the records; name the idle ones too for a fair mean)."""
    workers = list(workers) or records.workers()
    # created_at is an episode's end, after all its stamps: earlier episodes cannot reach W
    trajs = [t for t in records.trajectories if t.created_at >= window.start]
    per_worker = rollout_utilization(trajs, records.syncs, window, workers)
    trained = trained_in(records.rounds, records.batches, window)
    return Utilization(window=window, env=env_utilization(trajs, window, num_slots),
                       rollout=sum(per_worker.values()) / len(per_worker) if per_worker else 0.0,
                       per_worker=per_worker, trainer=trainer_utilization(records.rounds, window),
                       actions_per_min=actions_per_minute(trained, window), staleness=staleness_counts(trained))


def extent(records: RunRecords) -> Window | None:
    """From the first to the last wall-clock stamp in the records (None before any)."""
    spans = [s for t in records.trajectories for s in (*env_calls(t), *(st.gen_s for st in t.steps))]
    spans += [(r.fetch_start, r.publish_end) for r in records.rounds]
    spans += [(s.started, s.resumed) for s in records.syncs]
    spans = [(a, b) for a, b in spans if b > a]  # (0, 0): never happened
    if not spans:
        return None
    return Window(min(a for a, _ in spans), max(b for _, b in spans))
