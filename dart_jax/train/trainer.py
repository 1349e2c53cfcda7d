"""The trainer: one policy, its optimizer state and reference, updated batch by batch.

    trainer = Trainer(cfg, hf_dir, mesh)                       # fp32 master weights on `mesh`
    metrics = trainer.update_rl(rl_batch, collator)             # one curated GRPO batch
    metrics = trainer.update_sft([batch, ...])                  # accum_steps TrainBatches

The loops that drive it (SFT on files, DART's RL loop) are in `dart_jax.train.loop`; `save`
and `restore` checkpoint the params, optimizer state, step, policy version and data position.
"""

from __future__ import annotations

import logging
from pathlib import Path

import jax
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from dart_jax.models import hf_io
from dart_jax.models.sharding import make_mesh
from dart_jax.train.batch import Collator, TrainBatch
from dart_jax.train.checkpoint import CheckpointMeta, Checkpointer, abstract_state, config_hash
from dart_jax.train.config import TrainerConfig
from dart_jax.train.pipeline import RLBatch, to_global
from dart_jax.train.plan import plan_steps
from dart_jax.train.screens import ScreenCache
from dart_jax.train.step import (ROWS, Accumulator, RowTargets, Scores, Steps, TrainState,
                                 needs_old_logp)

log = logging.getLogger(__name__)


class Trainer:
    def __init__(self, cfg: TrainerConfig, hf_dir: str | Path, mesh: Mesh | None = None):
        self.cfg = cfg
        self.mesh = mesh or make_mesh(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tp)
        model, _ = hf_io.load_model(hf_dir, mesh=self.mesh, dtype=cfg.compute_dtype, remat=cfg.remat)
        graphdef, params = nnx.split(model)
        self.steps = Steps(graphdef, params, cfg, self.mesh)
        self.state: TrainState = self.steps.init_state(params)
        self.step = 0  # host copy of state.step: reading the device's would stall dispatch
        # the frozen reference is the starting policy, read again from hf_dir on resume
        self.ref_params = params if cfg.mode == "rl" and cfg.loss.kl_coef > 0 else None
        self.policy_version = 0  # the weight publisher's count (RL); 0 in SFT

    # -- updates
    def update_rl(self, rl: RLBatch, collator: Collator) -> dict:
        """`updates_per_batch` optimizer updates on one curated batch; metrics of the last."""
        micro, rows, plan_metrics = self.prepare_rl(rl, collator)
        for _ in range(self.cfg.updates_per_batch):
            metrics = self._apply(self.gradients(micro, rows))
        return metrics | plan_metrics

    def update_sft(self, batches: list[TrainBatch]) -> dict:
        """One optimizer update on host-local batches (cross-entropy on the loss mask)."""
        return self._apply(self.gradients(*self.prepare_sft(batches)))

    def prepare_sft(self, batches: list[TrainBatch]):
        """Global micro-batches; every real step counts (its advantage is unused)."""
        micro = [to_global(mb, self.mesh) for mb in batches]
        sharding = NamedSharding(self.mesh, PartitionSpec(ROWS))
        weights = [jax.make_array_from_process_local_data(sharding, mb.step_weight_BxP.reshape(-1))
                   for mb in batches]
        return micro, [RowTargets(w, w, Scores(None, None, None)) for w in weights]

    def prepare_rl(self, rl: RLBatch, collator: Collator):
        """Global micro-batches, and each one's row targets from the no-grad pass and the
        whole-batch plan (advantages, entropy selection)."""
        cache = ScreenCache(rl.screens, collator.image_cfg, self.cfg.screen_cache_bytes)
        micro = [to_global(mb, self.mesh) for mb in rl.microbatches(collator, cache)]
        params, none = self.state.params, Scores(None, None, None)
        need_scores = needs_old_logp(self.cfg) or self.ref_params is not None
        scores = [self.steps.score(params, self.ref_params, mb) if need_scores else none
                  for mb in micro]
        entropy = None
        if self.cfg.selection.enabled:
            entropy = np.zeros(len(rl.reward_N), np.float32)
            for m, s in enumerate(scores):
                step = rl.slot_steps(m)
                entropy[step[step >= 0]] = _host(s.entropy_N)[step >= 0]
        plan = plan_steps(self.cfg, rl.reward_N, rl.group_N, rl.traj_N, entropy)
        rows = [self._row_targets(plan.adv_N, plan.weight_N, rl.slot_steps(m), s) for m, s in enumerate(scores)]
        metrics = {k: np.float32(v) for k, v in plan.metrics.items()}
        metrics |= {"batch/steps": np.int32(len(rl.reward_N)), "batch/micro": np.int32(len(micro)),
                    "batch/dropped": np.int32(rl.dropped), "batch/screens_decoded": np.int32(cache.decodes),
                    "batch/screens_fetched_mb": np.float32(cache.fetched_bytes / 2**20)}
        return micro, rows, metrics

    def gradients(self, micro: list[TrainBatch], rows: list[RowTargets]) -> Accumulator:
        """Gradient and metric sums over the micro-batches, at the current parameters."""
        params = self.state.params
        acc = self.steps.zeros(params, micro[0], rows[0])
        for mb, r in zip(micro, rows):
            acc = self.steps.accumulate(params, acc, mb, r)
        return acc

    def _apply(self, acc: Accumulator) -> dict:
        self.state, metrics = self.steps.apply(self.state, acc)
        self.step += 1
        return metrics | {f"compiles/{k}": np.int32(v) for k, v in self.steps.compiles.items()}

    def _row_targets(self, adv_N, weight_N, slot_steps: np.ndarray, scores: Scores) -> RowTargets:
        """The plan's values of a micro-batch's global step slots (`slot_steps`: each slot's
        step in plan order, -1 for an empty one)."""
        sharding = NamedSharding(self.mesh, PartitionSpec(ROWS))
        on = slot_steps >= 0

        def put(x_N):
            x = np.where(on, x_N[np.maximum(slot_steps, 0)], 0.0).astype(np.float32)
            return jax.make_array_from_callback(x.shape, sharding, lambda i: x[i])

        return RowTargets(put(adv_N), put(weight_N), scores)

    # -- checkpoints
    def save(self, ckpt: Checkpointer, data_state: dict) -> bool:
        meta = CheckpointMeta(policy_version=self.policy_version, data_state=data_state,
                              config_hash=config_hash(self.cfg))
        return ckpt.save(self.step, self.state, meta)

    def restore(self, ckpt: Checkpointer) -> dict | None:
        """Load the latest checkpoint, if any; returns its data position."""
        if ckpt.latest_step() is None:
            return None
        shardings = jax.tree.broadcast(self.steps.state_shardings, self.state)  # per array
        target = abstract_state(self.state, shardings)
        self.state, meta = ckpt.restore(target, config_hash=config_hash(self.cfg))
        self.step = int(self.state.step)
        self.policy_version = meta.policy_version
        log.info("resumed at step %d (policy version %d)", self.step, self.policy_version)
        return meta.data_state


def _host(x: jax.Array) -> np.ndarray:
    """A (possibly multi-host) global array, whole, on every host."""
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
