"""`dart-jax run CONFIG`: a whole run, every role its own process, phase after phase.

    prepare the run directory (config, task list, the policy: a Hugging Face directory or
    a tiny Qwen2.5-VL built here), start the data manager and the env servers, then:
      demos   oracle demonstrations of every task: train ones into the experience pool
      sft     bootstrap the policy on them (the trainer in SFT mode, its own sub-run)
      eval    held-out success of the current policy (`dart-jax eval`)
      rl      the decoupled loop: rollout workers and the RL trainer until its last step
    plots, and a JSON summary as the last line printed.

`configs/local.yaml` (what `make run` runs) lists all of them; an RL config lists only rl.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import signal
import subprocess
import sys
import time
from pathlib import Path

from dart_jax.agent.prompt import PromptBuilder
from dart_jax.config import ConfigError, dump
from dart_jax.data.tasks import suite_tasks, write_task_file
from dart_jax.eval.stats import load_outcomes, paired_gain
from dart_jax.observe.learning import detect_collapse, success_curve
from dart_jax.observe.live import Watcher
from dart_jax.observe.records import RunReader
from dart_jax.run import demos
from dart_jax.run.launchers.remote import check_share_writable
from dart_jax.run.schema import RunConfig
from dart_jax.run.supervisor import RunFailed, Supervisor
from dart_jax.rundir import MetricsWriter, RunDir
from dart_jax.wire import Client
from dart_jax.wire.messages import PoolImport, PoolImported
from dart_jax.wire.trajfiles import write_trajectories

log = logging.getLogger(__name__)


def prepare(cfg: RunConfig) -> tuple[RunDir, Path]:
    """A fresh run directory with the resolved config, the task file and the policy."""
    from dart_jax.run.policy_dirs import initial_policy  # JAX, loaded only when a run prepares its policy
    root = Path(cfg.run.root) / cfg.run.name
    if (root / "config.yaml").exists():
        raise ConfigError("run config", "run.name", f"run directory {root} exists; choose another run.name")
    if not cfg.data.tasks.task_file:
        raise ConfigError("run config", "data.tasks.task_file", "must name the task list the run writes")
    if (store := cfg.data.store.db_file(root)).exists():  # a store off the run directory (the head's disk)
        raise ConfigError("run config", "data.store.db_path", f"{store} holds another run's store; choose a path "
                          "for this run")
    check_share_writable(cfg.tpu.shared_root, root.absolute())
    run = RunDir.create(root, config_yaml=dump(cfg))
    write_task_file(run.root / cfg.data.tasks.task_file, suite_tasks(cfg.tasks))
    return run, initial_policy(cfg, run)


def with_policy(cfg: RunConfig, policy: Path) -> RunConfig:
    return dataclasses.replace(cfg, policy=dataclasses.replace(cfg.policy, hf_dir=str(policy.resolve())))


def demos_phase(cfg: RunConfig, run: RunDir, policy: Path) -> dict:
    """Oracle episodes of every task; train successes -> data/demos -> the experience pool."""
    start = time.monotonic()
    tasks = suite_tasks(cfg.tasks)
    split = {t.task_id: t.split for t in tasks}
    trajs = asyncio.run(demos.collect(cfg.env_wires()[0], tasks, PromptBuilder.from_pretrained(policy, cfg.rollout.prompt),
                                      max_steps=cfg.tasks.demo_max_steps, concurrency=cfg.tasks.demo_concurrency))
    train = [t for t in trajs if t.status == "success" and split[t.task_id] == "train"]
    write_trajectories(run.data / "demos", train, "traj")
    with Client(cfg.data.wire) as dm:
        imported = dm.request(PoolImport(path="data/demos"))
    if not isinstance(imported, PoolImported):
        raise RuntimeError(f"the data manager answered PoolImport with {type(imported).__name__}")
    return {"demo_episodes": len(trajs), "demo_successes": sum(t.status == "success" for t in trajs),
            "demo_steps": sum(len(t.steps) for t in train), "pool_imported": imported.imported,
            "demo_s": round(time.monotonic() - start, 1)}


def sft_phase(cfg: RunConfig, run: RunDir, sup: Supervisor, policy: Path) -> tuple[Path, dict]:
    """The trainer in SFT mode on the demonstrations, as its own sub-run (run/sft/)."""
    start = time.monotonic()
    sub = dataclasses.replace(
        with_policy(cfg, policy), run=dataclasses.replace(cfg.run, root=str(run.root), name="sft"),
        trainer=dataclasses.replace(cfg.sft.trainer(cfg.trainer), steps=cfg.sft.steps, max_seconds=None,
                                    sft_data=str((run.data / "demos").resolve())))
    sup.start({"trainer"}, cfg=sub)
    sup.wait_done("trainer")
    sup.stop({"trainer"})
    records = [json.loads(line) for line in (run.root / "sft" / "metrics" / "trainer.jsonl").read_text().splitlines()]
    export = run.root / "sft" / "export" / f"step-{records[-1]['step']}"
    return export, {"sft_steps": records[-1]["step"], "sft_nll_first": records[0]["loss/nll"],
                    "sft_nll_last": records[-1]["loss/nll"], "sft_export": str(export),
                    "sft_s": round(time.monotonic() - start, 1)}


def eval_phase(cfg: RunConfig, run: RunDir, policy: Path, label: str) -> dict:
    """`dart-jax eval` on the run's env servers; results in run/eval/<label>.json."""
    start = time.monotonic()
    argv = [sys.executable, "-m", "dart_jax.cli", "eval", str(run.config_path), f"policy.hf_dir={policy.resolve()}",
            "--label", label]
    with open(run.log_path(f"eval-{label}.out"), "ab") as out:
        code = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT).returncode
    if code != 0:
        raise RunFailed(f"eval {label} exited with code {code} (see {run.log_path(f'eval-{label}.out')})")
    result = json.loads((run.root / "eval" / f"{label}.json").read_text())
    return {f"heldout_success_{label}": result["sampled"]["overall"]["success"],
            f"heldout_greedy_{label}": result["greedy"]["overall"]["success"] if "greedy" in result else None,
            f"eval_{label}_s": round(time.monotonic() - start, 1)}


def rl_phase(cfg: RunConfig, run: RunDir, sup: Supervisor, policy: Path, view) -> tuple[Path, dict]:
    """The decoupled loop: rollout workers and the RL trainer, until the trainer's last step."""
    start = time.monotonic()
    rl = with_policy(cfg, policy)
    sup.start({"trainer", "rollout"}, cfg=rl)
    sup.wait_done("trainer", on_tick=view)
    sup.stop({"rollout", "trainer"})
    records = [json.loads(line) for line in run.metrics_path("trainer").read_text().splitlines()]
    export = run.export / f"step-{records[-1]['step']}"
    versions = [r["policy/version"] for r in records if "policy/version" in r]
    return export, {"rl_steps": records[-1]["step"], "policy_versions": int(versions[-1]) if versions else 0,
                    "rl_stalled": "train/stalled" in records[-1],
                    "rl_out_of_time": "train/out_of_time" in records[-1],
                    "rl_export": str(export), "checkpoints": str(run.checkpoints),
                    "restarts": {k: v for k, v in sup.restarts().items() if v},
                    "rl_s": round(time.monotonic() - start, 1)} | rollout_learning(cfg, run)


def rollout_learning(cfg: RunConfig, run: RunDir) -> dict:
    """The train rollouts' success (observe/learning.py): its best and last window, and
    whether it collapsed (a 35% fall, or a late collapse: learning.py) at which policy version."""
    reader = RunReader(run.root, cfg.data.store.db_path)
    try:
        trajs = reader.refresh().trajectories
    finally:
        reader.close()
    curve, collapse = success_curve(trajs), detect_collapse(trajs)
    return {"rl_collapsed": collapse is not None, "rl_collapsed_version": None if collapse is None else collapse.version,
            "rl_rollout_success_best": max((p.success for p in curve), default=None),
            "rl_rollout_success_last": curve[-1].success if curve else None}


def gain(run: RunDir, labels: list[str]) -> dict:
    """Held-out gain of the last evaluation over the first (sampled episodes), paired over the
    same episodes, its 95% interval clustered by task (eval.stats.paired_gain)."""
    if len(labels) < 2:
        return {}
    first, last = (load_outcomes(run.root / "eval" / f"{label}.json") for label in (labels[0], labels[-1]))
    sampled = paired_gain([o for o in first if o.mode == "sampled"], [o for o in last if o.mode == "sampled"])
    return {"heldout_gain": sampled["gain"], "heldout_gain_ci95": sampled["ci95"], "heldout_pairs": sampled["n"],
            "heldout_tasks": sampled["clusters"]}


def stop_on_sigterm() -> None:
    """Make SIGTERM (kill, a batch scheduler, a test's cleanup) unwind like Ctrl-C, so that a
    program running `run` stops every role's process group (a rollout worker's vLLM engine
    included) on its way out instead of leaving them orphaned. Call from the main thread."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def run(cfg: RunConfig) -> dict:
    cfg = cfg.seeded()
    run_dir, policy = prepare(cfg)
    summary: dict = {"run_dir": str(run_dir.root), "mode": cfg.run.mode}
    labels: list[str] = []
    watcher = Watcher(cfg, run_dir)
    with Supervisor(cfg, run_dir) as sup:
        sup.start({"data-manager", "env-server"})
        for phase in cfg.run.phases:
            log.info("phase %s", phase)
            if phase == "demos":
                summary |= demos_phase(cfg, run_dir, policy)
            elif phase == "sft":
                policy, figures = sft_phase(cfg, run_dir, sup, policy)
                summary |= figures
            elif phase == "eval":
                labels.append(_label(labels, summary))
                summary |= eval_phase(cfg, run_dir, policy, labels[-1])
            else:
                policy, figures = rl_phase(cfg, run_dir, sup, policy, watcher.tick)
                summary |= figures
        watcher.close()
    summary |= gain(run_dir, labels) | {"plots": [str(p) for p in watcher.plots()], "policy": str(policy)}
    metrics = MetricsWriter(run_dir.metrics_path("run"))
    metrics.write(0, summary)
    metrics.close()
    return summary


def _label(labels: list[str], summary: dict) -> str:
    """eval labels: what the policy is at that point (init, sft, rl)."""
    return "rl" if "rl_steps" in summary else "sft" if "sft_steps" in summary else "init"
