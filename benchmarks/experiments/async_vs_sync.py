"""Decoupled (async) vs synchronous training, the same system in both modes, one invocation.

    .venv/bin/python -m benchmarks.experiments.async_vs_sync [--steps 12] [--warmup 2] [--median-s 2] [--sigma 1.2]

Each mode is a whole `dart-jax run` (phases demos, rl) with the same processes (a data
manager, one env server with `--slots` synthetic slots, one vLLM CPU rollout worker with
`--episodes` episodes, the JAX trainer), the same policy, tasks and number of trainer
steps; only `run.mode` differs. Env calls (reset, each step, the evaluation) take an
OSWorld-like heavy-tailed time: lognormal with median `--median-s` and spread `--sigma`,
capped at `--max-s`; an unparseable action ends the episode (`--invalid end`, the default) or
costs a step with a penalty (`--invalid penalty`: episodes run to the step cap). The trainer
has one bucket shape (`--seq-len`), so it compiles in its first round and never mid-run.
`--max-pending` caps the rollouts waiting for the trainer (in flight or unused) in both
modes (default: no cap, as measured in docs/benchmarks.md).

The figures come from the runs' own records (dart_jax.observe.utilization), over each run's
steady-state window: from the end of its `--warmup`-th round (the first compiles the
trainer's step, the engine warms up) to its last publish, the same computation in both modes:
- env utilization: time every slot spent inside env calls / (slots x window);
- rollout utilization: share of the window the worker's engine was generating (the union
  of its model calls, weight-load pauses excluded);
- trained actions per minute: steps of the batches trained in the window / minutes;
- staleness: trainer version minus the sampling version of each trained step.
The last line printed is JSON with env_util_async, env_util_sync, throughput_ratio
(trained actions per minute, async over sync), rollout_util_ratio and staleness_mean.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.common import machine, socket_overrides, work_dir
from dart_jax.config import load
from dart_jax.run.schema import RunConfig
from dart_jax.observe.records import RunReader
from dart_jax.observe.utilization import Window, measure
from dart_jax.run.main import run, stop_on_sigterm


def overrides(args, root: Path, mode: str) -> list[str]:
    latency = f"{{kind: lognormal, median_s: {args.median_s}, sigma: {args.sigma}, max_s: {args.max_s}, seed: 1}}"
    return [f"run.root={root}", f"run.name={mode}", f"run.mode={mode}", "run.phases=[demos, rl]", "run.view=lines",
            *socket_overrides(root, mode),
            f"envs.slots=[{{type: synthetic, count: {args.slots}, step_latency: {latency}}}]",
            f"envs.invalid_action={args.invalid}", "envs.step_timeout_s=60", "envs.reset_timeout_s=60",
            "tasks.suites=[{backend: synthetic, names: [click-button, enter-text, select-item, check-boxes], "
            "train_seeds: 4, eval_seeds: 1}]",
            f"data.curation.tasks_per_batch={args.tasks_per_batch}", "data.curation.min_rollouts=4",
            f"data.curation.max_pending={args.max_pending}",
            "data.curation.max_rollouts=4", "data.curation.group_size=4", "data.curation.max_pending_per_task=64",
            f"rollout.episodes={args.episodes}", "rollout.sampling.max_tokens=32",
            f"trainer.buckets.seq_lens=[{args.seq_len}]", f"trainer.buckets.num_slots=[{args.seq_len}]",
            "trainer.checkpoint.every_steps=1000", f"trainer.steps={args.steps}"]


def steady_window(rounds, warmup: int):
    """From the end of the `warmup`-th trainer round (its first batch request when 0) to the
    last publish: the rounds after the warm-up, each whole."""
    rounds = sorted(rounds, key=lambda r: r.publish_end)
    if len(rounds) <= warmup:
        raise ValueError(f"{len(rounds)} trainer rounds: none after the {warmup} warm-up rounds")
    start = rounds[warmup - 1].publish_end if warmup else rounds[0].fetch_start
    return Window(start, rounds[-1].publish_end)


def figures(run_dir: Path, slots: int, warmup: int):
    reader = RunReader(run_dir)
    records = reader.refresh()
    reader.close()
    return measure(records, steady_window(records.rounds, warmup), slots, ["rollout-0"])


def run_mode(args, root: Path, mode: str) -> dict:
    summary = run(load(RunConfig, "configs/rl.yaml", overrides(args, root, mode)))
    u = figures(Path(summary["run_dir"]), args.slots, args.warmup)
    out = {"env_util": u.env, "rollout_util": u.rollout, "trainer_util": u.trainer,
           "actions_per_min": u.actions_per_min, "staleness_mean": u.staleness_mean,
           "window_s": u.window.seconds, "trained_steps": sum(c for c in u.staleness.values())}
    print(json.dumps({"mode": mode, **out}), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=12, help="trainer steps in each mode")
    ap.add_argument("--warmup", type=int, default=2, help="rounds left out of the window (compilation, warm-up)")
    ap.add_argument("--invalid", choices=("end", "penalty"), default="end", help="what an unparseable action does")
    ap.add_argument("--seq-len", type=int, default=2048, help="the trainer's one bucket (tokens per row)")
    ap.add_argument("--median-s", type=float, default=2.0)
    ap.add_argument("--sigma", type=float, default=1.2)
    ap.add_argument("--max-s", type=float, default=30.0)
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--tasks-per-batch", type=int, default=2)
    ap.add_argument("--max-pending", type=int, default=0,
                    help="rollouts pending at most (in flight or unused; 0: no cap): how far the fleet may run ahead")
    ap.add_argument("--work", default=None, help="where the runs go, kept (default: a temporary directory, removed at the end)")
    args = ap.parse_args()
    stop_on_sigterm()  # killed, its runs' roles go with it
    with work_dir(args.work, "bench_async_sync_") as root:
        a, s = run_mode(args, root, "async"), run_mode(args, root, "sync")
    print(json.dumps({
        "benchmark": "async_vs_sync", "env_util_async": a["env_util"], "env_util_sync": s["env_util"],
        "env_util_ratio": a["env_util"] / s["env_util"], "throughput_ratio": a["actions_per_min"] / s["actions_per_min"],
        "rollout_util_ratio": a["rollout_util"] / s["rollout_util"], "staleness_mean": a["staleness_mean"],
        "staleness_mean_sync": s["staleness_mean"], "async": a, "sync": s, "steps": args.steps, "warmup": args.warmup, "invalid": args.invalid,
        "latency": {"median_s": args.median_s, "sigma": args.sigma, "max_s": args.max_s},
        "slots": args.slots, "episodes": args.episodes, "max_pending": args.max_pending, "machine": machine()}))


if __name__ == "__main__":
    main()
