"""`dart-jax rollout CONFIG`: the rollout role's entry point.

Reads the run config's `rollout`, `data`, `envs`, `weights` and `policy` sections, starts
the worker (rollout_gpu.worker) and serves until SIGTERM or SIGINT. The policy is the
run's Hugging Face directory: `policy.hf_dir`, else the run's `policy-init/` (made by
`dart-jax run` before it starts the roles).
"""

from __future__ import annotations

import asyncio
from dart_jax.rundir import MetricsWriter, RunDir
from rollout_gpu import worker


def main(cfg, run: RunDir) -> int:
    """Serve as rollout worker `cfg.rollout.worker_id` of the run in `run`."""
    env_wires = cfg.rollout.env_servers or (cfg.envs.wire,)
    metrics = MetricsWriter(run.metrics_path(f"rollout-{cfg.rollout.worker_id}"))
    try:
        asyncio.run(worker.serve(cfg.rollout, run.policy_dir(cfg.policy.hf_dir), cfg.data.wire, env_wires, cfg.weights, metrics))
    finally:
        metrics.close()
    return 0
