"""What entropy selection and TIS did to each task of one RL batch (issue 42's per-task trace).

    tasks = task_trace(batch, prepared, cfg)   # one TaskTrace per task (GRPO group) of the batch

Host-side, from values the preparation already holds: the steps' loss weights (selection's
kept steps are those with weight > 0) and advantages, and each microbatch's old log-probs
from the no-grad pass, gathered with the sampler's log-probs to recompute the TIS weights
the loss applied (tis.step_weight_sums). The trainer calls it after dispatching the batch's
updates, so the gathers overlap the device's work; nothing is added to the compiled step.

The TIS weights are known only where the no-grad pass scored old log-probs (selection on or
several updates a batch): with one update and no selection the loss takes pi_old from its own
gradient pass and the trace's TIS fields stay None (the batch-wide tis/weight_{pos,neg} of
the trainer's metrics still cover it). A TIS mean covers the sampled tokens of kept steps,
demonstrations and the pool's injected steps excluded (the loss gives those weight 1).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from dart_jax.train.batch import RLBatch
from dart_jax.train.collate import dense_ids
from dart_jax.train.config import TrainerConfig
from dart_jax.train.prepare import Prepared, gather_host
from dart_jax.train.tis import step_weight_sums


@dataclasses.dataclass(frozen=True)
class TaskTrace:
    """One task of a batch: its steps, the ones selection kept, its mean TIS weight by sign."""
    task: str
    steps: int
    kept: int | None  # steps entropy selection kept (None: selection off)
    tis_weight_pos: float | None  # mean over its tokens with A > 0 (None: not scored, TIS off, or no such token)
    tis_tokens_pos: int
    tis_weight_neg: float | None
    tis_tokens_neg: int

    def record(self) -> dict:
        """The JSON line of metrics/trainer_tasks.jsonl (without step and time)."""
        return {"task": self.task, "steps": self.steps, "kept": self.kept,
                "kept_frac": None if self.kept is None else self.kept / max(self.steps, 1),
                "tis/weight_pos": self.tis_weight_pos, "tis/tokens_pos": self.tis_tokens_pos,
                "tis/weight_neg": self.tis_weight_neg, "tis/tokens_neg": self.tis_tokens_neg}


def task_trace(batch: RLBatch, prepared: Prepared, cfg: TrainerConfig) -> tuple[TaskTrace, ...]:
    """One TaskTrace per task of `batch`, in its group numbering (collate.rl_microbatches')."""
    targets = prepared.targets
    if targets is None:
        raise ValueError("a per-task trace needs an RL batch's prepared step targets")
    tasks = list(dense_ids(t.task_id for t in batch.trajectories))
    kept_N = targets.weight_N > 0
    tis = step_tis(batch, prepared, cfg) if cfg.tis.enabled else None
    out = []
    for g, task in enumerate(tasks):
        own = batch.group_N == g
        sums = []
        for sign in (targets.adv_N > 0, targets.adv_N < 0):
            sel = own & kept_N & sign
            w, n = (None, 0) if tis is None else (float(tis[0][sel].sum()), int(tis[1][sel].sum()))
            sums.append((w / n if n else None, n))
        (wp, npos), (wn, nneg) = sums
        out.append(TaskTrace(task, int(own.sum()), int((own & kept_N).sum()) if cfg.selection.enabled else None,
                             wp, npos, wn, nneg))
    return tuple(out)


def step_tis(batch: RLBatch, prepared: Prepared, cfg: TrainerConfig) -> tuple[np.ndarray, np.ndarray] | None:
    """(sum of TIS weights, sampled tokens) of each step in layout order, None when the
    no-grad pass scored no old log-probs. Sampled: response tokens of steps that are neither
    demonstrations nor injected."""
    n = len(batch.reward_N)
    w_N, tokens_N = np.zeros(n), np.zeros(n)
    for m, (mb, rows) in enumerate(zip(prepared.micro, prepared.rows)):
        old = rows.scores.logp_old_NxT
        if old is None:
            return None
        old_NxT = gather_host(old)
        shape = old_NxT.shape
        rollout_NxT = gather_host(mb.rollout_logp_BxPxT).reshape(shape)
        mask_NxT = gather_host(mb.loss_mask_BxPxT).reshape(shape)
        demo_N = gather_host(mb.is_demo_BxP).reshape(-1)
        slots = batch.slot_steps(m)
        on = slots >= 0
        w, t = step_weight_sums(old_NxT, rollout_NxT, mask_NxT * ~demo_N[:, None], cap=cfg.tis.cap,
                                level=cfg.tis.level)
        w_N[slots[on]], tokens_N[slots[on]] = w[on], t[on]
    injected = batch.injected_N.astype(bool)
    return np.where(injected, 0.0, w_N), np.where(injected, 0.0, tokens_N)
