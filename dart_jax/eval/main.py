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
import re
import zlib
from pathlib import Path
from typing import Sequence

from dart_jax.agent.prompt import PromptBuilder
from dart_jax.config import UsageError
from dart_jax.data.tasks import load_tasks
from dart_jax.eval.config import EvalConfig
from dart_jax.eval.stats import Outcome, report, table
from dart_jax.wire.env_client import EnvPool
from dart_jax.wire.messages import TaskSpec
from envs.server import serving
from rollout_gpu.engine import Engine
from rollout_gpu.episode import run_episode


def eval_episodes(tasks: Sequence[TaskSpec], cfg: EvalConfig) -> list[tuple[TaskSpec, str, int]]:
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
    queue: asyncio.Queue = asyncio.Queue()
    for item in episodes:
        queue.put_nowait(item)
    outcomes: list[Outcome] = []

    async def player() -> None:
        while not queue.empty():
            task, mode, i = queue.get_nowait()
            policy = SeededPolicy(engine, temperature if mode == "sampled" else 0.0, cfg.seed, task.task_id, i)
            env = await envs.acquire(task.backend, 600.0)
            async with env:
                t = await run_episode(env, task, policy, builder, max_steps=cfg.max_steps, source="rollout")
            outcomes.append(Outcome(task.task_id, mode, i, t.status == "success", t.reward, len(t.steps), t.status,
                                    tuple(s.response_text[:160] for s in t.steps)))

    await asyncio.gather(*(player() for _ in range(min(cfg.concurrency, len(episodes)))))
    return outcomes


async def evaluate(run_cfg, policy_dir: Path, tasks: Sequence[TaskSpec], env_endpoint: str) -> list[Outcome]:
    """Play the eval split with a vLLM engine on `policy_dir`, against env slots of the run's
    kinds served here on `env_endpoint` (fresh slots, whatever the run's servers are doing)."""
    envs_cfg = dataclasses.replace(run_cfg.envs, wire=dataclasses.replace(run_cfg.envs.wire, endpoint=env_endpoint))
    engine = await Engine.start(policy_dir, run_cfg.rollout.engine, run_cfg.rollout.sampling)
    try:
        with serving(envs_cfg) as (_, wire):
            envs = EnvPool([dataclasses.replace(envs_cfg.wire, endpoint=wire.endpoint)], "eval")
            try:
                return await play(engine, PromptBuilder.from_pretrained(policy_dir, run_cfg.rollout.prompt), envs,
                                  eval_episodes(tasks, run_cfg.eval), run_cfg.eval, run_cfg.rollout.sampling.temperature)
            finally:
                await envs.aclose()
    finally:
        engine.shutdown()


def resolve_policy(cfg, run, policy: Path, label: str) -> Path:
    """A Hugging Face directory as is; a trainer's checkpoints/ directory exported first (its
    latest step, with the run's trainer settings and tokenizer files)."""
    if (policy / "config.json").is_file():
        return policy
    if not policy.is_dir():
        raise UsageError(f"--policy {policy}: no such directory")
    out = run.root / "eval" / f"{label}-policy"
    if not (out / "config.json").is_file():
        from dart_jax.train.export import export_checkpoint  # JAX, only when a checkpoint needs exporting
        export_checkpoint(policy, out, cfg.trainer, run.policy_dir(cfg.policy.hf_dir))
    return out


def check_label(label: str) -> str:
    """An eval label names files of the run (eval/LABEL.json, logs/eval-LABEL.log)."""
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}", label):
        raise UsageError(f"eval label {label!r}: letters, digits, '_', '.', '-' (it names a file)")
    return label


def main(cfg, run, policy: Path | None, label: str) -> dict:
    """Evaluate `policy` (default: the config's) on the run's eval tasks; write and return
    the result (run/eval/<label>.json). `run.seed` reaches the evaluation's seed as in
    `dart-jax run`, so the same seed replays the run's sampled episodes."""
    cfg = cfg.seeded()
    check_label(label)
    policy_dir = resolve_policy(cfg, run, policy, label) if policy else run.policy_dir(cfg.policy.hf_dir)
    tasks = load_tasks(cfg.data.tasks, run.root)
    if not any(t.split == "eval" for t in tasks):
        raise UsageError(f"the run's tasks ({cfg.data.tasks.task_file or 'inline'}) have no eval split")
    endpoint = f"ipc://{run.root.resolve()}/eval-{label}.sock"
    result = report(label, policy_dir, asyncio.run(evaluate(cfg, policy_dir, tasks, endpoint)))
    out = run.root / "eval" / f"{label}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(table(result))
    return {k: result[k] for k in ("label", "policy") if k in result} | {
        mode: result[mode]["overall"] for mode in ("sampled", "greedy") if mode in result}
