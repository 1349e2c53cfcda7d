"""`dart-jax train CONFIG`: the trainer role's entry point.

Loads the policy onto the mesh and trains it: RL on curated batches from the data manager
(publishing every new version to the rollout workers), or SFT on trajectory files. A
killed trainer started again resumes from its last checkpoint. At the end it exports the
policy as a Hugging Face directory under the run's export/. Metrics go to
metrics/trainer.jsonl and TensorBoard event files under tensorboard/trainer/.
"""

from __future__ import annotations

import dataclasses
import logging

from dart_jax.config.loader import bounded
from dart_jax.rundir import MetricsWriter, RunDir

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class TrainRunConfig:
    """How long the trainer runs and on what. Paths are relative to the run directory."""
    steps: int = bounded(100, ge=1)  # optimizer updates in total (a resumed run counts on)
    sft_data: str = "data/demos"  # SFT: a *.traj directory or a JSONL file
    export: bool = True


def main(cfg, run: RunDir) -> dict:
    """Train `cfg.train.steps` updates; returns the last metrics (and the export's path)."""
    from dart_jax.models import hf_io
    from dart_jax.train import loop
    from dart_jax.train.batch import BucketSpec, Collator
    from dart_jax.train.checkpoint import Checkpointer
    from dart_jax.train.pipeline import DataManagerSource, TrajectoryFileSource
    from dart_jax.train.publish import WeightPublisher
    from dart_jax.train.trainer import Trainer

    hf_dir, tcfg = run.policy_dir(cfg.policy.hf_dir), cfg.trainer
    collator = Collator.from_pretrained(hf_dir, BucketSpec(tcfg.buckets.seq_lens, tcfg.buckets.num_slots,
                                                           tcfg.buckets.rows))
    trainer = Trainer(tcfg, hf_dir)
    metrics = MetricsWriter(run.metrics_path("trainer"), tensorboard_dir=run.root / "tensorboard" / "trainer")
    last: dict = {}

    def record(step: int, values: dict) -> None:
        last.clear()
        last.update(step=step, **values)
        metrics.write(step, values)
        log.info("step %d: %s", step, {k: round(v, 5) for k, v in values.items() if not k.startswith("time/")})

    with Checkpointer(run.checkpoints, max_to_keep=tcfg.checkpoint.keep, async_save=tcfg.checkpoint.async_save) as ckpt:
        if tcfg.mode == "sft":
            source = iter(TrajectoryFileSource(run.root / cfg.train.sft_data, collator, seed=tcfg.seed))
            loop.sft(trainer, source, ckpt, cfg.train.steps, record)
        else:
            publisher = WeightPublisher(cfg.weights, hf_io.read_config(hf_dir), state_file=run.root / "weights.json")
            source = DataManagerSource(cfg.data.wire, collator)
            try:
                loop.rl(trainer, source, collator, publisher, ckpt, cfg.train.steps, record)
            finally:
                source.close()
                publisher.close()
    metrics.close()
    if cfg.train.export:
        out = hf_io.export(trainer.state.params, hf_io.read_config(hf_dir), run.export / f"step-{trainer.step}",
                           src_dir=hf_dir)
        last["export"] = str(out)
    return last
