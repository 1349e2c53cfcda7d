"""`dart-jax train CONFIG`: the trainer role's entry point.

Loads the policy onto the mesh and trains it: RL on curated batches from the data manager
(publishing every new version to the rollout workers), or SFT on trajectory files. A
killed trainer started again resumes from its last checkpoint. At the end it exports the
policy as a Hugging Face directory under the run's export/. Metrics go to
metrics/trainer.jsonl and TensorBoard event files under tensorboard/trainer/; in RL each
batch's per-task trace (task_trace.TaskTrace: steps, kept, TIS weight by sign) goes to
metrics/trainer_tasks.jsonl, one line per step and task.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import jax

from dart_jax.models import hf_io
from dart_jax.models.convert import hf_buckets
from dart_jax.rundir import MetricsWriter, RunDir
from dart_jax.train import loop
from dart_jax.train.batch import BucketSpec
from dart_jax.train.checkpoint import Checkpointer
from dart_jax.train.collate import Collator
from dart_jax.train.config import DistributedConfig
from dart_jax.train.heartbeat import Heartbeat
from dart_jax.train.publish import WeightPublisher
from dart_jax.train.sources import DataManagerSource, TrajectoryFileSource
from dart_jax.train.task_trace import TaskTrace
from dart_jax.train.trainer import Trainer

log = logging.getLogger(__name__)


SLICE_PORT = "8482"  # JAX's coordinator port on TPU slices (JAX_COORDINATOR_PORT overrides it)


def initialize_distributed(cfg: DistributedConfig) -> None:
    """Join the trainer's JAX process group (trainer.distributed; a no-op when off). Call it
    before anything runs on a JAX device: the backends start with the group. CPU hosts
    exchange through gloo (the setting only concerns the CPU backend)."""
    if cfg.mode == "off":
        return
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if cfg.mode == "auto":
        jax.distributed.initialize(*slice_from_environment())
        return
    if not cfg.coordinator:
        raise ValueError("trainer.distributed.coordinator: needed in explicit mode (host:port of process 0)")
    pid = cfg.process_id if cfg.process_id >= 0 else int(os.environ.get("DART_PROCESS_ID", "-1"))
    if not 0 <= pid < cfg.num_processes:
        raise ValueError(f"process id {pid}: set trainer.distributed.process_id or DART_PROCESS_ID "
                         f"to 0..{cfg.num_processes - 1}")
    jax.distributed.initialize(cfg.coordinator, cfg.num_processes, pid)


def slice_from_environment() -> tuple[str | None, int | None, int | None]:
    """(coordinator, process count, process id) from the variables GKE gives each host of a TPU
    slice (TPU_WORKER_HOSTNAMES, TPU_WORKER_ID), read here so that hosts JAX does not detect as
    TPU VMs (CPU or GPU hosts started the same way, the pod rehearsal) form the group as a slice
    does; (None, None, None) elsewhere, where JAX's own detection (the TPU metadata of a TPU VM)
    decides."""
    hosts, worker = os.environ.get("TPU_WORKER_HOSTNAMES"), os.environ.get("TPU_WORKER_ID")
    if not hosts or worker is None or int(os.environ.get("MEGASCALE_NUM_SLICES", "1")) > 1:
        return None, None, None
    names = hosts.split(",")
    return f"{names[0]}:{os.environ.get('JAX_COORDINATOR_PORT', SLICE_PORT)}", len(names), int(worker)


def main(cfg, run: RunDir) -> dict:
    """Train `cfg.trainer.steps` updates (fewer on a stall or a spent budget); returns the last
    metrics (and the export's path)."""
    initialize_distributed(cfg.trainer.distributed)

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

    if not (lead and tcfg.mode == "rl"):
        return _train(cfg, run, trainer, collator, hf_dir, lead, record, metrics, last)
    with Heartbeat(cfg.data.wire, cfg.run.heartbeat_s, lambda: (trainer.step, trainer.version.value)) as beat:
        _train(cfg, run, trainer, collator, hf_dir, lead, record, metrics, last)
        beat.finish()
    return last


def _train(cfg, run: RunDir, trainer: Trainer, collator: Collator, hf_dir: Path, lead: bool, record, metrics,
           last: dict) -> dict:
    """The training loop of main (SFT or RL), then the export."""
    tcfg = cfg.trainer
    with Checkpointer(run.checkpoints, max_to_keep=tcfg.checkpoint.keep, async_save=tcfg.checkpoint.async_save) as ckpt:
        if tcfg.mode == "sft":
            source = iter(TrajectoryFileSource(run.root / tcfg.sft_data, collator, seed=tcfg.seed,
                                               screen_cache_bytes=tcfg.screen_cache_bytes))
            loop.sft_loop(trainer, source, ckpt, tcfg.steps, record, loop.Budget(tcfg.max_seconds))
        else:
            publisher = WeightPublisher(cfg.weights, hf_io.read_config(hf_dir), state_file=run.root / "weights.json",
                                        version=trainer.version)
            source = DataManagerSource(cfg.data.wire, collator, max_wait_s=tcfg.batch_wait_s,
                                       version=trainer.version)
            tasks = MetricsWriter(run.metrics_path("trainer_tasks")) if lead else None
            try:
                loop.rl_loop(trainer, source, collator, publisher, ckpt, tcfg.steps, record,
                             loop.Budget(tcfg.max_seconds), None if tasks is None else task_writer(tasks))
            finally:
                source.close()
                publisher.close()
                if tasks is not None:
                    tasks.close()
    if metrics is not None:
        metrics.close()
    if tcfg.export:
        last["export"] = str(export(trainer, hf_dir, run.export / f"step-{trainer.step}", lead))
    return last


def task_writer(writer: MetricsWriter) -> loop.LogTasks:
    """rl_loop's `log_tasks`: one line of `writer` per task of the batch."""
    def write(step: int, tasks: tuple[TaskTrace, ...]) -> None:
        for t in tasks:
            writer.write(step, t.record())
    return write


def export(trainer, hf_dir: Path, out: Path, lead: bool) -> Path:
    """The Hugging Face export. Every host walks the conversion (its gathers are
    collectives); only the lead host writes the files."""
    config = hf_io.read_config(hf_dir)
    if lead:
        return hf_io.export(trainer.state.params, config, out, src_dir=hf_dir)
    for _ in hf_buckets(trainer.state.params, config):
        pass
    return out
