"""`dart-jax train CONFIG`: the trainer role.

Loads the policy onto the mesh, reads batches (SFT: trajectory files; RL: curated batches
from the data manager), updates with checkpoints (a killed run resumes where it stopped),
and exports the trained policy as a Hugging Face directory under the run's export/.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from dart_jax.config.loader import bounded
from dart_jax.rundir import MetricsWriter, RunDir

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class TrainRunConfig:
    """How long the trainer runs and on what. Paths are relative to the run directory."""
    steps: int = bounded(100, ge=1)  # optimizer updates in total (a resumed run counts on)
    sft_data: str = "data/demos"  # SFT: a *.traj directory or a JSONL file
    policy_dir: str = ""  # the starting policy; "" = the run config's policy
    export: bool = True


def run(cfg, run_dir: RunDir, hf_dir: Path) -> dict:
    """Train `cfg.train.steps` updates from `hf_dir`; returns the last metrics."""
    from dart_jax.train.batch import BucketSpec, Collator
    from dart_jax.train.checkpoint import Checkpointer
    from dart_jax.train.pipeline import DataManagerSource, TrajectoryFileSource
    from dart_jax.train.trainer import Trainer, run as train

    tcfg = cfg.trainer
    buckets = BucketSpec(tcfg.buckets.seq_lens, tcfg.buckets.num_slots, tcfg.buckets.rows)
    collator = Collator.from_pretrained(hf_dir, buckets)
    if tcfg.mode == "sft":
        source = iter(TrajectoryFileSource(run_dir.root / cfg.train.sft_data, collator, seed=tcfg.seed))
    else:
        source = DataManagerSource(cfg.data.wire, collator)
    trainer = Trainer(tcfg, hf_dir)
    metrics = MetricsWriter(run_dir.metrics_path("trainer"))
    last: dict = {}

    def on_metrics(step: int, values: dict) -> None:
        last.clear()
        last.update({"step": step, **{k: float(v) for k, v in values.items()}})
        metrics.write(step, values)
        log.info("step %d: %s", step, {k: round(float(v), 5) for k, v in values.items()})

    with Checkpointer(run_dir.checkpoints, max_to_keep=tcfg.checkpoint.keep,
                      async_save=tcfg.checkpoint.async_save) as ckpt:
        train(trainer, source, cfg.train.steps, ckpt, collator=collator, on_metrics=on_metrics)
    metrics.close()
    if cfg.train.export:
        from dart_jax.models import hf_io
        out = hf_io.export(trainer.state.params, hf_io.read_config(hf_dir),
                           run_dir.export / f"step-{trainer.step}", src_dir=hf_dir)
        last["export"] = str(out)
    return last
