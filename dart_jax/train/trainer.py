"""The trainer: one policy, its optimizer state and reference, updated batch by batch.

    trainer = Trainer(cfg, hf_dir, mesh)                       # fp32 master weights on `mesh`
    metrics = trainer.update_rl(batch, collator)                # one curated GRPO batch (RLBatch)
    trainer.tasks                                               # its per-task trace (task_trace.py)
    metrics = trainer.update_sft([batch, ...])                  # accum_steps TrainBatches

The loops that drive it (SFT on files, DART's RL loop) are in `dart_jax.train.loop`, the RL
preparation of a batch (scores, advantages, selection) in `dart_jax.train.prepare`; `save`
and `restore` checkpoint the params, optimizer state, step, policy version and data position.
"""

from __future__ import annotations

import logging
from pathlib import Path

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from dart_jax.models import hf_io
from dart_jax.models.sharding import make_mesh
from dart_jax.train.batch import RLBatch, TrainBatch
from dart_jax.train.checkpoint import CheckpointMeta, Checkpointer, abstract_state, config_hash
from dart_jax.train.collate import Collator
from dart_jax.train.config import TrainerConfig
from dart_jax.train.prepare import Prepared, prepare_rl, prepare_sft
from dart_jax.train.step import Accumulator, TrainFunctions, TrainState
from dart_jax.train.task_trace import TaskTrace, task_trace
from dart_jax.train.version import PolicyVersion

log = logging.getLogger(__name__)


class Trainer:
    def __init__(self, cfg: TrainerConfig, hf_dir: str | Path, mesh: Mesh | None = None):
        self.cfg = cfg
        self.mesh = mesh or make_mesh(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tp)
        model, _ = hf_io.load_model(hf_dir, mesh=self.mesh, dtype=cfg.compute_dtype, remat=cfg.remat)
        graphdef, params = nnx.split(model)
        self.fns = TrainFunctions(graphdef, params, cfg, self.mesh)
        self.state: TrainState = self.fns.init_state(params)
        self.step = 0  # host copy of state.step: reading the device's would stall dispatch
        # the frozen reference is the starting policy, read again from hf_dir on resume
        self.ref_params = params if cfg.mode == "rl" and cfg.loss.kl_coef > 0 else None
        self.version = PolicyVersion()  # advanced by the weight publisher (RL); 0 in SFT
        self.tasks: tuple[TaskTrace, ...] = ()  # the last RL batch's per-task trace

    # -- updates
    def update_rl(self, batch: RLBatch, collator: Collator) -> dict:
        """`updates_per_batch` optimizer updates on one curated batch; metrics of the last.
        Sets `tasks`, read on the host while the device runs the updates."""
        prepared = prepare_rl(self.fns, self.state.params, self.ref_params, batch, collator, self.cfg)
        for _ in range(self.cfg.updates_per_batch):
            metrics = self._apply(self.gradients(prepared))
        self.tasks = task_trace(batch, prepared, self.cfg)
        return metrics | prepared.metrics

    def update_sft(self, batches: list[TrainBatch]) -> dict:
        """One optimizer update on host-local batches (cross-entropy on the loss mask)."""
        return self._apply(self.gradients(prepare_sft(self.mesh, batches)))

    def gradients(self, prepared: Prepared) -> Accumulator:
        """Gradient and metric sums over the micro-batches, at the current parameters."""
        params = self.state.params
        acc = self.fns.zeros(params, prepared.micro[0], prepared.rows[0])
        for mb, r in zip(prepared.micro, prepared.rows):
            acc = self.fns.accumulate(params, acc, mb, r)
        return acc

    def _apply(self, acc: Accumulator) -> dict:
        self.state, metrics = self.fns.apply(self.state, acc)
        self.step += 1
        return metrics | {f"compiles/{k}": np.int32(v) for k, v in self.fns.compiles.items()}

    # -- checkpoints
    def save(self, ckpt: Checkpointer, data_state: dict) -> bool:
        meta = CheckpointMeta(policy_version=self.version.value, data_state=data_state,
                              config_hash=config_hash(self.cfg.learning()))
        return ckpt.save(self.step, self.state, meta)

    def restore(self, ckpt: Checkpointer) -> dict | None:
        """Load the latest checkpoint, if any; returns its data position. The policy version
        is not restored: the publisher numbers on from the last version it published."""
        if ckpt.latest_step() is None:
            return None
        shardings = jax.tree.broadcast(self.fns.state_shardings, self.state)  # per array
        target = abstract_state(self.state, shardings)
        self.state, meta = ckpt.restore(target, config_hash=config_hash(self.cfg.learning()))
        self.step = int(self.state.step)
        log.info("resumed at step %d (checkpointed at policy version %d)", self.step, meta.policy_version)
        return meta.data_state
