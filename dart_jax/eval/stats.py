"""Held-out success as numbers: episode outcomes, Wilson intervals, paired gains, the table.

`paired_gain` compares two evaluations of the same episodes (same task, mode and sample
index: the same seeds) with a paired interval clustered by task (a task's samples are not
independent draws).
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Callable, Sequence

from scipy.stats import t as student_t


@dataclasses.dataclass(frozen=True)
class Outcome:
    task_id: str
    mode: str  # "sampled" | "greedy"
    sample: int
    success: bool
    reward: float
    steps: int
    status: str
    actions: tuple[str, ...] = ()  # what the policy wrote, step by step (each cut at 160 characters)


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion:
    (p + z²/2n ± z·sqrt(p(1-p)/n + z²/4n²)) / (1 + z²/n)."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    center = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, center - half), min(1.0, center + half)


def paired_gain(before: Sequence[Outcome], after: Sequence[Outcome],
                cluster: Callable[[Outcome], str] = lambda o: o.task_id) -> dict:
    """Mean success difference over the episodes both evaluations played (same task, mode
    and sample index: the same seeds), with a task-clustered 95% interval.

    The samples of one task share its difficulty, so they are not independent draws: the
    episodes are clustered by (`cluster`: the task by default, mode), C clusters with
    difference sums S_c over n_c pairs,

        gain = sum_c S_c / sum_c n_c
        se²  = C / (C - 1) · sum_c (S_c - gain · n_c)² / (sum_c n_c)²     (cluster-robust)
        ci95 = gain ± t_{C-1, 0.975} · se

    With equal cluster sizes this is the t-interval on the per-task mean differences. One
    cluster gives no interval width (C - 1 = 0): ValueError.
    """
    old = {(o.task_id, o.mode, o.sample): o.success for o in before}
    sums: dict[tuple[str, str], list[float]] = {}
    for o in after:
        if (k := (o.task_id, o.mode, o.sample)) in old:
            sums.setdefault((cluster(o), o.mode), []).append(float(o.success) - float(old[k]))
    if not sums:
        raise ValueError("the two evaluations share no episode")
    if len(sums) < 2:
        raise ValueError("a task-clustered interval needs episodes of at least two tasks")
    n = sum(len(d) for d in sums.values())
    mean = sum(sum(d) for d in sums.values()) / n
    c = len(sums)
    var = c / (c - 1) * sum((sum(d) - mean * len(d)) ** 2 for d in sums.values()) / n**2
    half = float(student_t.ppf(0.975, c - 1)) * math.sqrt(var)
    return {"gain": mean, "ci95": [mean - half, mean + half], "n": n, "clusters": c}


def summarize(outcomes: Sequence[Outcome], mode: str) -> dict:
    mine = [o for o in outcomes if o.mode == mode]
    per_task = {}
    for task in sorted({o.task_id for o in mine}):
        ok = [o.success for o in mine if o.task_id == task]
        per_task[task] = {"success": sum(ok) / len(ok), "n": len(ok), "ci95": list(wilson(sum(ok), len(ok)))}
    wins = sum(o.success for o in mine)
    return {"overall": {"success": wins / max(1, len(mine)), "n": len(mine), "ci95": list(wilson(wins, len(mine)))},
            "per_task": per_task}


def table(result: dict) -> str:
    """Per-task and overall success, one line each, for the terminal."""
    lines = [f"{'task':<40} {'mode':<8} {'success':>8}  95% interval      n"]
    for mode in ("sampled", "greedy"):
        if mode not in result:
            continue
        rows = [*result[mode]["per_task"].items(), ("overall", result[mode]["overall"])]
        lines += [f"{task:<40} {mode:<8} {r['success']:>8.3f}  [{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}]  {r['n']:>4}"
                  for task, r in rows]
    return "\n".join(lines)


def load_outcomes(path: Path) -> list[Outcome]:
    return [outcome_of(e) for e in json.loads(Path(path).read_text())["episodes"]]


def outcome_of(episode: dict) -> Outcome:
    """An Outcome from its JSON form (`report`'s episodes; "actions" may be absent)."""
    return Outcome(**{**episode, "actions": tuple(episode.get("actions", ()))})


def report(label: str, policy_dir: Path, outcomes: Sequence[Outcome]) -> dict:
    modes = sorted({o.mode for o in outcomes})
    return {"label": label, "policy": str(policy_dir), "time": time.time(),
            **{mode: summarize(outcomes, mode) for mode in modes},
            "episodes": [dataclasses.asdict(o) for o in outcomes]}
