"""`dart-jax eval CONFIG --policy PATH`: online success on the held-out split.

Every eval task of the run (held-out seeds: never batched, never trained on) is played
`eval.samples` times at the rollout temperature, each request with a seed derived from
(task, sample, step) so the same policy gives the same episodes again, and once greedily.
Success rates per task and overall come with 95% Wilson intervals; `paired_gain`
compares two evaluations of the same episodes (a paired interval over their outcomes).
Results go to runs/<name>/eval/<label>.json and a table on stdout.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import re
import time
import zlib
from pathlib import Path
from typing import Sequence

from dart_jax.config import bounded
from dart_jax.wire.messages import TaskSpec


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    samples: int = bounded(4, ge=0)  # sampled episodes per eval task
    greedy: bool = True  # and one greedy episode per eval task
    max_steps: int = bounded(15, ge=1)
    concurrency: int = bounded(8, ge=1)
    seed: int = bounded(0, ge=0)


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


def plan(tasks: Sequence[TaskSpec], cfg: EvalConfig) -> list[tuple[TaskSpec, str, int]]:
    """(task, mode, sample index) of every episode, eval tasks only."""
    held = [t for t in tasks if t.split == "eval"]
    return ([(t, "sampled", i) for t in held for i in range(cfg.samples)]
            + ([(t, "greedy", 0) for t in held] if cfg.greedy else []))


class SeededPolicy:
    """The engine sampling one episode: each request seeded by (seed, task, sample, step)."""

    def __init__(self, engine, temperature: float, seed: int, task_id: str, sample: int):
        self.engine, self.temperature, self.step = engine, temperature, 0
        self.base = zlib.crc32(f"{seed}/{task_id}/{sample}".encode())

    async def sample(self, prompt, observation, task):
        self.step += 1
        return await self.engine.sample(prompt, temperature=self.temperature, seed=(self.base + self.step) % 2**31)


async def play(engine, builder, envs, episodes, cfg: EvalConfig, temperature: float) -> list[Outcome]:
    from rollout_gpu.episode import run_episode
    queue: asyncio.Queue = asyncio.Queue()
    for item in episodes:
        queue.put_nowait(item)
    outcomes: list[Outcome] = []

    async def player() -> None:
        while not queue.empty():
            task, mode, i = queue.get_nowait()
            policy = SeededPolicy(engine, temperature if mode == "sampled" else 0.0, cfg.seed, task.task_id, i)
            env, _ = await envs.acquire(task.backend, 600.0)
            async with env:
                t = await run_episode(env, task, policy, builder, max_steps=cfg.max_steps, source="rollout")
            outcomes.append(Outcome(task.task_id, mode, i, t.status == "success", t.reward, len(t.steps), t.status,
                                    tuple(s.response_text[:160] for s in t.steps)))

    await asyncio.gather(*(player() for _ in range(min(cfg.concurrency, len(episodes)))))
    return outcomes


async def evaluate(run_cfg, policy_dir: Path, tasks: Sequence[TaskSpec], env_endpoint: str) -> list[Outcome]:
    """Play the eval split with a vLLM engine on `policy_dir`, against env slots of the run's
    kinds served here on `env_endpoint` (fresh slots, whatever the run's servers are doing)."""
    from dart_jax.agent.prompt import PromptBuilder
    from envs.server import serving
    from rollout_gpu.engine import Engine
    from rollout_gpu.worker import EnvPool
    envs_cfg = dataclasses.replace(run_cfg.envs, wire=dataclasses.replace(run_cfg.envs.wire, endpoint=env_endpoint))
    engine = await Engine.start(policy_dir, run_cfg.rollout.engine, run_cfg.rollout.sampling)
    try:
        with serving(envs_cfg) as (_, wire):
            envs = EnvPool([dataclasses.replace(envs_cfg.wire, endpoint=wire.endpoint)], "eval")
            try:
                return await play(engine, PromptBuilder.from_pretrained(policy_dir, run_cfg.rollout.prompt), envs,
                                  plan(tasks, run_cfg.eval), run_cfg.eval, run_cfg.rollout.sampling.temperature)
            finally:
                await envs.aclose()
    finally:
        engine.shutdown()


def report(label: str, policy_dir: Path, outcomes: Sequence[Outcome]) -> dict:
    modes = sorted({o.mode for o in outcomes})
    return {"label": label, "policy": str(policy_dir), "time": time.time(),
            **{mode: summarize(outcomes, mode) for mode in modes},
            "episodes": [dataclasses.asdict(o) for o in outcomes]}


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


def resolve_policy(run, policy: Path, label: str) -> Path:
    """A Hugging Face directory as is; a trainer's checkpoints/ directory exported first."""
    if (policy / "config.json").is_file():
        return policy
    from dart_jax.run.hf_commands import export_hf
    out = run.root / "eval" / f"{label}-policy"
    if not (out / "config.json").is_file():
        export_hf(policy, out)
    return out


def main(cfg, run, policy: Path | None, label: str) -> dict:
    """Evaluate `policy` (default: the config's) on the run's eval tasks; write and return
    the result (run/eval/<label>.json). `run.seed` reaches the evaluation's seed as in
    `dart-jax run`, so the same seed replays the run's sampled episodes."""
    from dart_jax.data.tasks import load_tasks
    cfg = cfg.seeded()
    policy_dir = resolve_policy(run, policy, label) if policy else run.policy_dir(cfg.policy.hf_dir)
    tasks = load_tasks(cfg.data.tasks, run.root)
    if not any(t.split == "eval" for t in tasks):
        raise ValueError(f"the run's tasks ({cfg.data.tasks.task_file or 'inline'}) have no eval split")
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}", label):
        raise ValueError(f"eval label {label!r}: letters, digits, '_', '.', '-' (it names a file)")
    endpoint = f"ipc://{run.root.resolve()}/eval-{label}.sock"
    result = report(label, policy_dir, asyncio.run(evaluate(cfg, policy_dir, tasks, endpoint)))
    out = run.root / "eval" / f"{label}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(table(result))
    return {k: result[k] for k in ("label", "policy") if k in result} | {
        mode: result[mode]["overall"] for mode in ("sampled", "greedy") if mode in result}
