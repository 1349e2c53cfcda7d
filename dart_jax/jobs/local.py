"""`dart-jax local CONFIG`: the local default job, all roles on one machine.

1. the run directory with the resolved config and the task list (train and eval splits);
2. the policy: the configured Hugging Face directory, or a tiny Qwen2.5-VL built here;
3. the env server and the data manager as their own processes;
4. oracle demonstrations of every task through the env server: the train split's go into
   the data manager's experience pool, the eval split's are kept apart for measuring;
5. the trainer, as its own process, bootstraps the policy on the train demonstrations with
   SFT, checkpoints it and exports it (Hugging Face);
6. the held-out check: NLL of the eval demonstrations before and after.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path

from dart_jax.config import ConfigError, dump
from dart_jax.run.schema import RunConfig
from dart_jax.data.pool import write_trajectories
from dart_jax.data.tasks import write_task_file
from dart_jax.jobs import demos
from dart_jax.jobs.procs import RoleProcess
from dart_jax.rundir import MetricsWriter, RunDir
from dart_jax.wire import Client
from dart_jax.wire.messages import DataStats, PoolImport, PoolImported, StatsRequest

log = logging.getLogger(__name__)


def prepare(cfg: RunConfig) -> RunDir:
    """The run directory, its resolved config and its task list file."""
    if not cfg.data.tasks.task_file:
        raise ConfigError("run config", "data.tasks.task_file", "must name the task list the job writes")
    if (Path(cfg.run.root) / cfg.run.name / "config.yaml").exists():
        raise ConfigError("run config", "run.name",
                          f"run directory {Path(cfg.run.root) / cfg.run.name} exists; choose another run.name")
    run = RunDir.create(Path(cfg.run.root) / cfg.run.name, config_yaml=dump(cfg))
    write_task_file(run.root / cfg.data.tasks.task_file, cfg.job.tasks())
    return run


def policy_dir(cfg: RunConfig, run: RunDir) -> Path:
    if cfg.policy.hf_dir:
        return Path(cfg.policy.hf_dir)
    from dart_jax.models.tiny import make_tiny_hf_dir
    out = run.root / "policy-init"
    if not (out / "config.json").exists():
        make_tiny_hf_dir(out, seed=cfg.policy.tiny_seed)
    return out


def collect_demos(cfg: RunConfig, run: RunDir, hf_dir: Path) -> dict:
    """Oracle episodes of every task: train -> data/demos/ -> the experience pool;
    eval -> data/eval_demos/, never pooled or trained on."""
    from dart_jax.agent.prompt import PromptBuilder
    tasks = cfg.job.tasks()
    split = {t.task_id: t.split for t in tasks}
    start = time.monotonic()
    trajs = asyncio.run(demos.collect(cfg.envs.wire, tasks, PromptBuilder.from_pretrained(hf_dir),
                                      max_steps=cfg.job.demo_max_steps, concurrency=cfg.job.demo_concurrency))
    successes = [t for t in trajs if t.status == "success" and split[t.task_id] == "train"]
    write_trajectories(run.data / "demos", successes, "traj")
    write_trajectories(run.data / "eval_demos",
                       [t for t in trajs if t.status == "success" and split[t.task_id] == "eval"], "traj")
    with Client(cfg.data.wire) as dm:
        # relative to the run directory: the data manager confines request paths to it
        imported = dm.request(PoolImport(path=str((run.data / "demos").relative_to(run.root))))
        stats = dm.request(StatsRequest())
    if not isinstance(stats, DataStats) or not isinstance(imported, PoolImported):
        raise RuntimeError(f"data manager answered {type(imported).__name__}/{type(stats).__name__}, "
                           "expected PoolImported/DataStats")
    return {"demo_episodes": len(trajs), "demo_successes": sum(t.status == "success" for t in trajs),
            "demo_steps": sum(len(t.steps) for t in successes), "pool_imported": imported.imported,
            "pool_size": stats.pool, "demo_s": round(time.monotonic() - start, 2)}


def bootstrap(cfg: RunConfig, run: RunDir, hf_dir: Path) -> dict:
    """SFT in the trainer role's own process, then the held-out NLL before and after."""
    from dart_jax.jobs.evaluate import demo_nll
    trainer = RoleProcess("train", run.config_path, [], run.log_path("trainer.out"))
    if (code := trainer.wait()) != 0:
        raise RuntimeError(f"the trainer exited with code {code} (see {run.log_path('trainer.out')})")
    records = [json.loads(line) for line in run.metrics_path("trainer").read_text().splitlines()]
    exported = sorted(run.export.glob("step-*"), key=lambda p: int(p.name.split("-")[1]))[-1]
    eval_demos = run.data / "eval_demos"
    return {"sft_steps": records[-1]["step"], "sft_nll_first": records[0]["loss/nll"],
            "sft_nll_last": records[-1]["loss/nll"], "export": str(exported),
            "eval_nll_before": demo_nll(hf_dir, eval_demos, cfg.trainer),
            "eval_nll_after": demo_nll(exported, eval_demos, cfg.trainer)}


def run(cfg: RunConfig) -> dict:
    run_dir = prepare(cfg)
    hf_dir = policy_dir(cfg, run_dir)
    roles = [RoleProcess(role, run_dir.config_path, [], run_dir.log_path(f"{role}.out"))
             for role in ("env-server", "data-manager")]
    summary: dict = {"run_dir": str(run_dir.root), "policy_init": str(hf_dir)}
    try:
        roles[0].wait_ready(cfg.envs.wire, cfg.run.ready_timeout_s)
        roles[1].wait_ready(cfg.data.wire, cfg.run.ready_timeout_s)
        summary.update(collect_demos(cfg, run_dir, hf_dir))
    finally:
        for role in roles:
            role.stop()
    summary.update(bootstrap(cfg, run_dir, hf_dir))
    metrics = MetricsWriter(run_dir.metrics_path("local"))
    metrics.write(0, summary)
    metrics.close()
    log.info("local job done: %s", json.dumps(summary))
    return summary
