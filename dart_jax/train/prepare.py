"""The RL preparation of one curated batch, before its first gradient (DART, step-wise GRPO):

    micro    = this host's microbatches, built and sharded    (collate.rl_microbatches, batch.to_global)
    scores   = the no-grad pass over each: old log-probs,      (step.TrainFunctions.score)
               step entropies, reference log-probs
    adv_N    = each step's reward normalized over its group    (advantages.grpo_step_advantages)
    weight_N = its loss weight: trajectory normalization, and  (selection.select_steps)
               0 for the steps entropy selection drops (the kept
               ones rescaled so each cell keeps its weight)
    rows     = adv_N and weight_N at each microbatch's step slots, beside its scores

Advantages and selection need every step of the batch (group statistics, a global top
fraction), so they run once per batch on small host arrays, padded to a power of two so that
they compile O(log(batch size)) times, not once per batch.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from dart_jax.train.advantages import grpo_step_advantages, trajectory_step_weights
from dart_jax.train.batch import ROWS, RLBatch, TrainBatch, to_global
from dart_jax.train.collate import Collator, rl_microbatches
from dart_jax.train.config import TrainerConfig
from dart_jax.train.screens import ScreenCache
from dart_jax.train.selection import select_steps
from dart_jax.train.step import RowTargets, Scores, TrainFunctions, needs_old_logp


@dataclasses.dataclass(frozen=True)
class StepTargets:
    adv_N: np.ndarray  # float32: GRPO advantage of each step
    weight_N: np.ndarray  # float32: loss weight (0: not selected)
    metrics: dict[str, float]


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A batch ready for gradients: global microbatches, each one's row targets, and metrics."""
    micro: list[TrainBatch]
    rows: list[RowTargets]
    metrics: dict[str, np.generic]
    targets: StepTargets | None = None  # RL: each step's advantage and loss weight, host-side


def prepare_rl(fns: TrainFunctions, params, ref_params, batch: RLBatch, collator: Collator,
               cfg: TrainerConfig) -> Prepared:
    """The module docstring's steps for one curated batch, at the current parameters."""
    cache = ScreenCache(batch.screens, collator.image_cfg, cfg.screen_cache_bytes)
    micro = [to_global(mb, fns.mesh) for mb in rl_microbatches(batch, collator, cache)]
    scores = [score_microbatch(fns, cfg, params, ref_params, mb) for mb in micro]
    entropy_N = step_entropies(batch, scores) if cfg.selection.enabled else None
    targets = step_targets(cfg, batch.reward_N, batch.group_N, batch.traj_N, entropy_N, batch.injected_N)
    rows = [row_targets(fns.mesh, targets, batch.slot_steps(m), s, batch.injected_N)
            for m, s in enumerate(scores)]
    metrics = {k: np.float32(v) for k, v in targets.metrics.items()}
    metrics |= {"batch/steps": np.int32(len(batch.reward_N)), "batch/micro": np.int32(len(micro)),
                "batch/dropped": np.int32(batch.dropped), "batch/screens_decoded": np.int32(cache.decodes),
                "batch/screens_fetched_mb": np.float32(cache.fetched_bytes / 2**20)}
    return Prepared(micro, rows, metrics, targets)


def prepare_sft(mesh: Mesh, batches: list[TrainBatch]) -> Prepared:
    """Global micro-batches; every real step counts with weight 1 (its advantage is unused)."""
    sharding = NamedSharding(mesh, PartitionSpec(ROWS))
    weights = [jax.make_array_from_process_local_data(sharding, mb.step_weight_BxP.reshape(-1))
               for mb in batches]
    return Prepared([to_global(mb, mesh) for mb in batches],
                    [RowTargets(w, w, Scores(None, None, None)) for w in weights], {})


def score_microbatch(fns: TrainFunctions, cfg: TrainerConfig, params, ref_params, mb: TrainBatch) -> Scores:
    """The no-grad pass, when the config needs one (several updates, selection, a KL term)."""
    if needs_old_logp(cfg) or ref_params is not None:
        return fns.score(params, ref_params, mb)
    return Scores(None, None, None)


def step_entropies(batch: RLBatch, scores: list[Scores]) -> np.ndarray:
    """float32 [N]: each kept step's mean response-token entropy, in layout order."""
    entropy = np.zeros(len(batch.reward_N), np.float32)
    for m, s in enumerate(scores):
        slots = batch.slot_steps(m)
        entropy[slots[slots >= 0]] = gather_host(s.entropy_N)[slots >= 0]
    return entropy


def step_targets(cfg: TrainerConfig, reward_N: np.ndarray, group_N: np.ndarray, traj_N: np.ndarray,
                 entropy_N: np.ndarray | None, injected_N: np.ndarray | None = None) -> StepTargets:
    """Advantages and weights of the N steps of one batch (entropy_N: step mean entropies,
    needed when selection is enabled; injected_N: steps of pool successes, never dropped)."""
    n = len(reward_N)
    if cfg.selection.enabled and entropy_N is None:
        raise ValueError("entropy selection needs the steps' entropies")
    size = max(8, 1 << (n - 1).bit_length())
    pad = lambda x, dt: np.pad(np.asarray(x, dt), (0, size - n))  # noqa: E731
    ent = pad(np.zeros(n) if entropy_N is None else entropy_N, np.float32)
    protect = pad(np.zeros(n) if injected_N is None else injected_N, np.float32)
    adv, weight, metrics = _targets(
        pad(reward_N, np.float32), pad(group_N, np.int32), pad(traj_N, np.int32),
        pad(np.ones(n), np.float32), ent, protect, normalize=cfg.loss.advantage_normalize,
        eps=cfg.loss.advantage_eps, fraction=cfg.selection.fraction if cfg.selection.enabled else 0.0,
        scope=cfg.selection.scope)
    return StepTargets(np.asarray(adv)[:n], np.asarray(weight)[:n], {k: float(v) for k, v in metrics.items()})


@functools.partial(jax.jit, static_argnames=("normalize", "eps", "fraction", "scope"))
def _targets(reward_S, group_S, traj_S, valid_S, entropy_S, protect_S, *, normalize, eps, fraction, scope):
    S = reward_S.shape[0]
    adv = grpo_step_advantages(reward_S, group_S, traj_S, valid_S, num_groups=S, num_trajs=S,
                               normalize=normalize, eps=eps)
    weight = (trajectory_step_weights(traj_S, valid_S, S) if normalize == "trajectory"
              else valid_S)
    metrics = {"adv/mean_abs": jnp.sum(jnp.abs(adv)) / jnp.maximum(valid_S.sum(), 1)}
    if fraction > 0:
        weight, sel = select_steps(entropy_S, adv, weight, group_S, valid_S, protect_S, fraction=fraction,
                                   scope=scope, num_groups=S)
        metrics |= sel
    # sum w A / sum w |A|: 0 when each group's signed weights cancel; < 0 pushes every token
    # the batch's responses share (the action format) down
    metrics["adv/net"] = jnp.sum(weight * adv) / jnp.maximum(jnp.sum(weight * jnp.abs(adv)), 1e-30)
    return adv, weight, metrics


def row_targets(mesh: Mesh, targets: StepTargets, slot_steps: np.ndarray, scores: Scores,
                injected_N: np.ndarray) -> RowTargets:
    """The targets of a microbatch's global step slots (`slot_steps`: each slot's step in
    layout order, -1 for an empty one), sharded as its rows; `injected_N` marks the steps of
    the pool's injected successes (the loss treats them as demonstrations)."""
    sharding = NamedSharding(mesh, PartitionSpec(ROWS))
    on = slot_steps >= 0

    def put(x_N):
        x = np.where(on, x_N[np.maximum(slot_steps, 0)], 0.0).astype(np.float32)
        return jax.make_array_from_callback(x.shape, sharding, lambda i: x[i])

    return RowTargets(put(targets.adv_N), put(targets.weight_N), scores, put(injected_N))


def gather_host(x: jax.Array) -> np.ndarray:
    """A (possibly multi-host) global array, whole, on every host."""
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
