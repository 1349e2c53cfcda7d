"""What the rollout engine sampled vs what the trainer computes for the same tokens.

    .venv/bin/python -m benchmarks.components.parity [--trajectories 16] [--text 16]

The tiny Qwen2.5-VL policy (fp32, init 0.1 so logits are O(1-10)). A rollout worker (vLLM
CPU build) plays synthetic GUI episodes against a data manager and an env server: every
step has screenshots. Text-only prompts go through the same engine. Each sampled step is
then scored by the Flax policy on the trainer's own path (collator, shape buckets, fused
log-prob kernel at the rollout temperature): the gap truncated importance sampling sees.
The last line printed is JSON with `text_mean_abs`, `image_mean_abs`, `max_abs`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from pathlib import Path

import numpy as np

from benchmarks.common import machine, running_worker, work_dir

PROMPTS = ("Type hello into the search box.", "Click the OK button.", "Open the settings menu and enable dark mode.",
           "Scroll down to the footer.", "Select the third item of the list.", "Press submit.")


async def sample_text(engine, builder, n: int):
    """Text-only prompts through the engine, as one-step trajectories without screenshots."""
    from dart_jax.wire.messages import Step, Trajectory
    trajs = []
    for i in range(n):
        prompt = builder.tokenize_messages([{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}])
        s = await engine.sample(prompt)
        step = Step(prompt_ids=prompt.token_ids, response_ids=s.token_ids, logprobs=s.logprobs, image_refs=[],
                    policy_version=s.policy_version, response_text=s.text)
        trajs.append(Trajectory(traj_id=uuid.uuid4().hex, task_id="text", steps=[step], screenshots=[],
                                reward=0.0, status="failure"))
    return trajs


def gaps(hf_dir: Path, trajs) -> tuple[np.ndarray, np.ndarray]:
    """|trainer - sampler| per token, for steps with and without screenshots."""
    from flax import nnx

    from dart_jax.models import hf_io
    from dart_jax.train.batch import BucketSpec
    from dart_jax.train.collate import Collator
    from dart_jax.train.config import TrainerConfig
    from dart_jax.train.rescore import rescore
    model, _ = hf_io.load_model(hf_dir)
    collator = Collator.from_pretrained(hf_dir, BucketSpec((512, 1024, 2048, 4096), (1024, 4096), 4))
    scores = rescore(nnx.split(model), trajs, collator, TrainerConfig())
    d = {True: [], False: []}
    for s in scores:
        d[s.images > 0].append(np.abs(s.policy_logp_R.astype(np.float64) - s.sampled_logp_R))
    return tuple(np.concatenate(d[k]) if d[k] else np.zeros(0) for k in (False, True))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trajectories", type=int, default=16)
    ap.add_argument("--text", type=int, default=16)
    args = ap.parse_args()

    from dart_jax.agent.prompt import PromptBuilder
    from dart_jax.run.schema import RunConfig
    from dart_jax.models.tiny import make_tiny_hf_dir
    from dart_jax.testing.local_stack import LocalStack
    from dart_jax.wire.messages import TaskSpec
    from rollout_gpu.config import SamplingConfig
    from rollout_gpu.engine import Engine

    with work_dir(None, "bench_parity_") as work:
        hf_dir = make_tiny_hf_dir(work / "policy", init_std=0.1)
        tasks = [TaskSpec(task_id=f"synthetic/{name}/{i}", backend="synthetic", name=name, seed=i)
                 for name in ("click-button", "enter-text", "select-item") for i in range(3)]

        async def collect():
            engine = await Engine.start(hf_dir, RunConfig().rollout.engine, SamplingConfig(max_tokens=32))
            try:
                with LocalStack(work / "run", hf_dir, tasks) as stack:
                    async with running_worker(stack, engine, episodes=4):
                        while stack.stats().trajectories < args.trajectories:
                            await asyncio.sleep(1.0)
                    rollouts = stack.trajectories()
                return rollouts, await sample_text(engine, PromptBuilder.from_pretrained(hf_dir), args.text)
            finally:
                engine.shutdown()

        start = time.time()
        rollouts, texts = asyncio.run(collect())
        text, image = gaps(hf_dir, rollouts + texts)
    both = np.concatenate([text, image])
    print(json.dumps({"benchmark": "parity", "text_mean_abs": float(text.mean()), "image_mean_abs": float(image.mean()),
                      "max_abs": float(both.max()), "text_tokens": len(text), "image_tokens": len(image),
                      "trajectories": len(rollouts), "seconds": round(time.time() - start, 1),
                      "machine": machine()}))


if __name__ == "__main__":
    main()
