"""Rollout throughput of one worker: K = 1, 4, 8 episodes at once on one vLLM engine.

    .venv/bin/python -m benchmarks.components.rollout [--episodes 1 4 8] [--seconds 60] [--step-s 0.5]

Against synthetic env slots whose steps take `--step-s` seconds (lognormal with
`--sigma`; 0 = fixed), one slot per episode, so the envs are slow but never scarce.
Per K: generated tokens per second, episodes per minute, and the fraction of the engine's
time idle waiting on envs (wall time with no request of this worker in the engine: the
complement of the union of every step's generation interval). The tiny policy, fp32, CPU
build of vLLM; the last line printed is JSON with the figures and the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import time

from benchmarks.common import machine, running_worker, union_s, work_dir


async def measure(stack, engine, k: int, seconds: float) -> dict:
    async with running_worker(stack, engine, episodes=k):
        await asyncio.sleep(min(20.0, seconds / 3))  # warm up: prefix caches, first prompts
        start = time.time()
        await asyncio.sleep(seconds)
        end = time.time()
    trajs = [t for t in stack.trajectories() if t.steps and t.steps[0].gen_s[0] >= start and t.created_at <= end]
    steps = [s for t in stack.trajectories() for s in t.steps if start <= s.gen_s[1] <= end]
    busy = union_s([s.gen_s for s in steps], start, end)
    return {"episodes": k, "tokens_per_s": round(sum(len(s.response_ids) for s in steps) / (end - start), 1),
            "episodes_per_min": round(60 * len(trajs) / (end - start), 2),
            "engine_idle_fraction": round(1 - busy / (end - start), 3), "steps": len(steps)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--episodes", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--step-s", type=float, default=0.5, help="median env step time")
    ap.add_argument("--sigma", type=float, default=0.0, help="lognormal spread of step times (0: fixed)")
    ap.add_argument("--max-tokens", type=int, default=48)
    args = ap.parse_args()

    from dart_jax.run.schema import RunConfig
    from dart_jax.models.tiny import make_tiny_hf_dir
    from dart_jax.testing.local_stack import LocalStack
    from dart_jax.wire.messages import TaskSpec
    from envs.config import Latency, SyntheticSlots
    from rollout_gpu.config import SamplingConfig
    from rollout_gpu.engine import Engine

    with work_dir(None, "bench_rollout_") as work:
        hf_dir = make_tiny_hf_dir(work / "policy")
        latency = Latency(kind="lognormal" if args.sigma else "fixed", median_s=args.step_s, sigma=args.sigma)
        base = RunConfig()
        cfg = dataclasses.replace(
            base, envs=dataclasses.replace(base.envs, slots=(SyntheticSlots(count=max(args.episodes), step_latency=latency),)),
            data=dataclasses.replace(base.data, curation=dataclasses.replace(
                base.data.curation, max_pending_per_task=1_000_000, default_max_steps=10, max_steps=10)))
        tasks = [TaskSpec(task_id=f"synthetic/click-button/{i}", backend="synthetic", name="click-button", seed=i)
                 for i in range(8)]
        async def run_all() -> list[dict]:
            engine = await Engine.start(hf_dir, cfg.rollout.engine, SamplingConfig(max_tokens=args.max_tokens))
            results = []
            try:
                for k in args.episodes:
                    with LocalStack(work / f"run-{k}", hf_dir, tasks, cfg) as stack:
                        results.append(await measure(stack, engine, k, args.seconds))
                    print(json.dumps(results[-1]), flush=True)
            finally:
                engine.shutdown()
            return results

        results = asyncio.run(run_all())
    print(json.dumps({"benchmark": "rollout", "step_s": args.step_s, "sigma": args.sigma, "seconds": args.seconds,
                      "max_tokens": args.max_tokens, "results": results, "machine": machine()}))


if __name__ == "__main__":
    main()
