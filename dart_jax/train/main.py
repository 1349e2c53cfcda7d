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
import os
from pathlib import Path
from typing import Literal

from dart_jax.config.loader import bounded
from dart_jax.rundir import MetricsWriter, RunDir

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
    """A multi-host trainer (`jax.distributed`): every host runs the same `dart-jax train`
    with the same config and forms one mesh. `auto`: JAX finds the coordinator itself
    (Cloud TPU, GKE). `explicit`: `coordinator` (host:port of process 0) and
    `num_processes`; each host's `process_id`, or -1 to read DART_PROCESS_ID, so hosts differ
    only by their environment. CPU hosts exchange through gloo."""
    mode: Literal["off", "auto", "explicit"] = "off"
    coordinator: str = ""
    num_processes: int = bounded(1, ge=1)
    process_id: int = bounded(-1, ge=-1)

    def initialize(self) -> None:
        import jax
        if self.mode == "off":
            return
        if self.mode == "auto":
            jax.distributed.initialize()
            return
        if not self.coordinator:
            raise ValueError("train.distributed.coordinator: needed in explicit mode (host:port of process 0)")
        pid = self.process_id if self.process_id >= 0 else int(os.environ.get("DART_PROCESS_ID", "-1"))
        if not 0 <= pid < self.num_processes:
            raise ValueError(f"process id {pid}: set train.distributed.process_id or DART_PROCESS_ID "
                             f"to 0..{self.num_processes - 1}")
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(self.coordinator, self.num_processes, pid)


@dataclasses.dataclass(frozen=True)
class TrainRunConfig:
    """How long the trainer runs and on what. Paths are relative to the run directory."""
    steps: int = bounded(100, ge=1)  # optimizer updates in total (a resumed run counts on)
    # RL: the longest wait for one curated batch before the trainer stops early at the step it
    # reached (metrics: train/stalled; its checkpoint and export as usual). It also bounds how
    # long an unanswering data manager is asked again (then the trainer fails, and the
    # supervisor restarts it from its checkpoint). None: no limit.
    batch_wait_s: float | None = bounded(None, gt=0)
    # the training loop's wall-clock budget in seconds, from its start in this process (a
    # resumed trainer gets it afresh): the trainer stops before the first update that would
    # begin past it, or when it runs out waiting for a batch (metrics: train/out_of_time;
    # checkpoint and export as usual). On a pod, process 0's clock decides. `dart-jax run`
    # gives it to the RL phase only. None: no limit.
    max_seconds: float | None = bounded(None, gt=0)
    sft_data: str = "data/demos"  # SFT: a *.traj directory or a JSONL file
    export: bool = True
    distributed: DistributedConfig = DistributedConfig()


def main(cfg, run: RunDir) -> dict:
    """Train `cfg.train.steps` updates (fewer on a stall or a spent budget); returns the last
    metrics (and the export's path)."""
    cfg.train.distributed.initialize()
    import jax
    from dart_jax.models import hf_io
    from dart_jax.train import loop
    from dart_jax.train.batch import BucketSpec, Collator
    from dart_jax.train.checkpoint import Checkpointer
    from dart_jax.train.pipeline import DataManagerSource, TrajectoryFileSource
    from dart_jax.train.publish import WeightPublisher
    from dart_jax.train.trainer import Trainer

    hf_dir, tcfg = run.policy_dir(cfg.policy.hf_dir), cfg.trainer
    collator = Collator.from_pretrained(hf_dir, BucketSpec(tcfg.buckets.seq_lens, tcfg.buckets.num_slots,
                                                           tcfg.buckets.rows, tcfg.buckets.pack))
    trainer = Trainer(tcfg, hf_dir)
    lead = jax.process_index() == 0  # the host that logs, serves weights and writes the export
    metrics = MetricsWriter(run.metrics_path("trainer"), tensorboard_dir=run.root / "tensorboard" / "trainer") \
        if lead else None
    last: dict = {}

    def record(step: int, values: dict) -> None:
        last.clear()
        last.update(step=step, **values)
        if metrics is not None:
            metrics.write(step, values)
        log.info("step %d: %s", step, {k: round(v, 5) for k, v in values.items() if not k.startswith("time/")})

    with Checkpointer(run.checkpoints, max_to_keep=tcfg.checkpoint.keep, async_save=tcfg.checkpoint.async_save) as ckpt:
        if tcfg.mode == "sft":
            source = iter(TrajectoryFileSource(run.root / cfg.train.sft_data, collator, seed=tcfg.seed,
                                               screen_cache_bytes=tcfg.screen_cache_bytes))
            loop.sft(trainer, source, ckpt, cfg.train.steps, record, loop.Budget(cfg.train.max_seconds))
        else:
            publisher = WeightPublisher(cfg.weights, hf_io.read_config(hf_dir), state_file=run.root / "weights.json")
            source = DataManagerSource(cfg.data.wire, collator, max_wait_s=cfg.train.batch_wait_s)
            try:
                loop.rl(trainer, source, collator, publisher, ckpt, cfg.train.steps, record,
                        loop.Budget(cfg.train.max_seconds))
            finally:
                source.close()
                publisher.close()
    if metrics is not None:
        metrics.close()
    if cfg.train.export:
        last["export"] = str(export(trainer, hf_dir, run.export / f"step-{trainer.step}", lead))
    return last


def export(trainer, hf_dir: Path, out: Path, lead: bool) -> Path:
    """The Hugging Face export. Every host walks the conversion (its gathers are
    collectives); only the lead host writes the files."""
    from dart_jax.models import hf_io
    from dart_jax.models.convert import hf_buckets
    config = hf_io.read_config(hf_dir)
    if lead:
        return hf_io.export(trainer.state.params, config, out, src_dir=hf_dir)
    for _ in hf_buckets(trainer.state.params, config):
        pass
    return out
