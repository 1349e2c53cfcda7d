"""Held-out success as numbers: episode outcomes, Wilson intervals, paired gains, the table.

`paired_gain` compares two evaluations of the same episodes (same task, mode and sample
index: the same seeds) with a paired interval over their outcomes.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Sequence


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


def paired_gain(before: Sequence[Outcome], after: Sequence[Outcome], z: float = 1.96) -> dict:
    """Mean success difference over the episodes both evaluations played (same task, mode
    and sample index: the same seeds), with its normal interval mean ± z·sd/sqrt(n)."""
    old = {(o.task_id, o.mode, o.sample): o.success for o in before}
    d = [float(o.success) - float(old[k]) for o in after if (k := (o.task_id, o.mode, o.sample)) in old]
    if not d:
        raise ValueError("the two evaluations share no episode")
    mean = sum(d) / len(d)
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / max(1, len(d) - 1))
    half = z * sd / math.sqrt(len(d))
    return {"gain": mean, "ci95": [mean - half, mean + half], "n": len(d)}


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
    return [Outcome(**{**e, "actions": tuple(e.get("actions", ()))}) for e in json.loads(Path(path).read_text())["episodes"]]


def report(label: str, policy_dir: Path, outcomes: Sequence[Outcome]) -> dict:
    modes = sorted({o.mode for o in outcomes})
    return {"label": label, "policy": str(policy_dir), "time": time.time(),
            **{mode: summarize(outcomes, mode) for mode in modes},
            "episodes": [dataclasses.asdict(o) for o in outcomes]}
