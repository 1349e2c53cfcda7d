"""The train step: pure functions of (state, micro-batch), compiled once per shape bucket.

One optimizer update on a batch of M micro-batches (each padded to its own bucket):

    scores_m = score(params, ref_params, micro_m)        # no grad: old/ref logprobs, entropy
    rows_m = prepare(...)                                # host: advantages, selection (prepare.py)
    acc = zeros
    for m: acc = accumulate(params, acc, micro_m, rows_m) # grads and sums of the UNIT objective
    state, metrics = apply(state, acc)                   # divide by the global counts, AdamW

Losses are evaluated with UNIT denominators, so `acc` holds gradient *sums* and token/row
counts; `apply` divides once: exact global means under any split into micro-batches (losses.py).

The model reads a micro-batch's B rows; everything after it is per step, over the N = B x P step
slots (batch.py: a packed row holds up to P steps). `token_scores` returns each row's log-probs
once per slot of the row ([N, T]), and each slot's loss mask picks its own positions, so the
losses' rows are steps whether or not rows are packed.
`TrainFunctions` compiles each function once per (bucket, shardings) with explicit in/out shardings and
donated buffers (the state into `apply`, the accumulator into `accumulate`), and counts the
compilations; its `compile_*` methods compile without running (from arrays or ShapeDtypeStructs),
from any thread: a program another thread is compiling is waited for, not compiled twice. Parameters stay fp32 (master weights); the model's compute dtype is set when it
is built (`compute_dtype`).
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from dart_jax.models import qwen25vl
from dart_jax.models.sharding import param_shardings
from dart_jax.train import losses
from dart_jax.train.batch import ROWS, TrainBatch, batch_specs
from dart_jax.train.config import TrainerConfig
from dart_jax.train.kernels import kernel_chunks, token_logprobs_entropy_BxT
from dart_jax.train.losses import UNIT, Denominators, RLTerms, SignSums, sign_metrics, sign_sums
from dart_jax.train.optimizer import AdamWState, FusedAdamW
from dart_jax.train.selection import step_mean_entropy
from dart_jax.train.tis import MismatchSums, mismatch_metrics, mismatch_sums, tis_weights

@dataclasses.dataclass(frozen=True)
class TrainState:
    step: jax.Array  # int32 []: optimizer updates done
    params: nnx.State  # fp32 master weights
    opt_state: AdamWState


@dataclasses.dataclass(frozen=True)
class Scores:
    """A micro-batch's no-grad pass: each field None when the config does not need it."""
    logp_old_NxT: jax.Array | None  # policy before the update (several updates, selection)
    entropy_N: jax.Array | None  # mean response-token entropy of each step (selection)
    logp_ref_NxT: jax.Array | None  # frozen reference (kl_coef > 0)


@dataclasses.dataclass(frozen=True)
class RowTargets:
    """Per-step values decided over the whole batch, plus the micro-batch's scores."""
    adv_N: jax.Array  # GRPO advantage
    weight_N: jax.Array  # 0 drops the step (padding, not selected); else its loss weight
    scores: Scores
    # 1 on the experience pool's injected steps: treated as demonstrations (no TIS, clipped
    # against the trainer), since their sampler log-probs are of a policy many versions old
    injected_N: jax.Array | None = None


@dataclasses.dataclass(frozen=True)
class Accumulator:
    grads: nnx.State  # sums of UNIT-objective gradients, fp32
    sums: dict[str, jax.Array]  # sums of UNIT-objective metrics, by their logged names
    mismatch: MismatchSums | None  # trainer-vs-sampler logprob sums (RL); None in SFT
    signs: SignSums | None  # token push, clip and TIS by advantage sign (RL); None in SFT
    counts: Denominators  # masked tokens and rows of every step in the batch, selected or not


for _cls in (TrainState, Scores, RowTargets, Accumulator):
    jax.tree_util.register_dataclass(_cls, data_fields=[f.name for f in dataclasses.fields(_cls)],
                                     meta_fields=[])


# ---- pure functions -------------------------------------------------------------------

def token_scores(graphdef, params, mb: TrainBatch, cfg: TrainerConfig, *, entropy_grad=False):
    """(logp_NxT, entropy_NxT) of mb.targets_BxT at the rollout's temperatures, per step slot."""
    h_BxTxD = qwen25vl.hidden_states((graphdef, params), mb.inputs)
    w_DxV = qwen25vl.lm_head_kernel((graphdef, params)).astype(h_BxTxD.dtype)
    # empty slots carry temperature 0; greedy (0) sampling has no logprobs to match anyway
    tau_BxP = jnp.where(mb.temperature_BxP > 0, mb.temperature_BxP, 1.0)
    slot_BxT = jnp.maximum(mb.inputs.attention_mask - 1, 0)  # the step slot of each token
    tau_BxT = jnp.take_along_axis(tau_BxP, slot_BxT, axis=1)
    ct, cv = kernel_chunks(cfg.kernel, jax.default_backend(), mb.targets_BxT.size, w_DxV.shape[1])
    logp, ent = token_logprobs_entropy_BxT(h_BxTxD, w_DxV, mb.targets_BxT, tau_BxT,
                                           chunk_tokens=ct, chunk_vocab=cv, entropy_grad=entropy_grad)
    pack = mb.step_weight_BxP.shape[1]
    return per_slot(logp, pack), per_slot(ent, pack)


def per_slot(x_BxT: jax.Array, pack: int) -> jax.Array:
    """[B * P, T]: row b's values once for each of its step slots (b, j)."""
    b, t = x_BxT.shape
    return jnp.broadcast_to(x_BxT[:, None], (b, pack, t)).reshape(b * pack, t)


def _steps(x_BxPx):
    """A [B, P, ...] array of a TrainBatch as [N, ...] (N = B * P step slots)."""
    return x_BxPx.reshape(-1, *x_BxPx.shape[2:])


def needs_old_logp(cfg: TrainerConfig) -> bool:
    return cfg.mode == "rl" and (cfg.updates_per_batch > 1 or cfg.selection.enabled)


def score(graphdef, cfg: TrainerConfig, params, ref_params, mb: TrainBatch) -> Scores:
    """The no-grad pass over one micro-batch before any update of this batch."""
    logp_old = entropy = logp_ref = None
    if needs_old_logp(cfg):
        logp_old, ent = token_scores(graphdef, params, mb, cfg)
        entropy = step_mean_entropy(ent, _steps(mb.loss_mask_BxPxT))
    if cfg.loss.kl_coef > 0:
        logp_ref, _ = token_scores(graphdef, ref_params, mb, cfg)
    return Scores(logp_old, entropy, logp_ref)


def rl_loss(graphdef, cfg: TrainerConfig, params, mb: TrainBatch, rows: RowTargets):
    """UNIT-denominator RL objective of one micro-batch:
    (loss sum, (metric sums, mismatch sums, sign sums, counts)).

    The counts cover every step of the batch, the ones entropy selection dropped included:
    selection already restores each cell's weight (selection.py), so dividing by the kept
    count as well would scale the gradient by a batch-varying 1/kept_frac."""
    logp, ent = token_scores(graphdef, params, mb, cfg, entropy_grad=cfg.loss.entropy_coef > 0)
    steps_mask = _steps(mb.loss_mask_BxPxT)
    mask = steps_mask * (rows.weight_N > 0)[:, None]
    old = rows.scores.logp_old_NxT
    old = jax.lax.stop_gradient(logp) if old is None else old
    rollout = _steps(mb.rollout_logp_BxPxT)
    # demonstrations have no sampler log-probs; injected pool successes have a stale sampler's
    exempt_N = _steps(mb.is_demo_BxP)
    if rows.injected_N is not None:
        exempt_N = exempt_N | (rows.injected_N > 0)
    terms, sampled, w_tis = rl_terms(cfg, old, rollout, mask, exempt_N, rows.adv_N, rows.weight_N,
                                     rows.scores.logp_ref_NxT)
    loss, metrics = losses.rl_objective(logp, ent, terms, cfg.loss, UNIT)
    mismatch = mismatch_sums(old, rollout, sampled, w_tis, cfg.tis.cap)
    signs = sign_sums(logp, terms, cfg.loss, UNIT)
    return loss, (metrics, mismatch, signs, losses.denominators(steps_mask))


def rl_terms(cfg: TrainerConfig, logp_old_NxT, logp_rollout_NxT, mask_NxT, exempt_N, adv_N, weight_N,
             logp_ref_NxT=None) -> tuple[RLTerms, jax.Array, jax.Array]:
    """The loss's per-token inputs: (terms, sampled_NxT, raw TIS weights).

    Sampled tokens (not `exempt_N`: demonstrations, injected pool successes) get the TIS
    weight min(pi_old / pi_sampler, C) and, with loss.clip_to "behaviour", the clip against
    the sampler; exempt tokens get weight 1 and the clip against pi_old."""
    sampled = mask_NxT * ~exempt_N[:, None]
    w_tis = tis_weights(logp_old_NxT, logp_rollout_NxT, sampled, cap=cfg.tis.cap, level=cfg.tis.level)
    tis = jnp.where(sampled > 0, w_tis, 1.0) if cfg.tis.enabled else jnp.ones_like(mask_NxT)
    clip_to = (jnp.where(sampled > 0, logp_rollout_NxT, logp_old_NxT)
               if cfg.loss.clip_to == "behaviour" else None)
    terms = RLTerms(logp_old_NxT, adv_N, mask_NxT, weight_N, tis, logp_ref_NxT, clip_to)
    return terms, sampled, w_tis


def sft_loss(graphdef, cfg: TrainerConfig, params, mb: TrainBatch, rows: RowTargets):
    """UNIT-denominator cross-entropy on the demonstration tokens of one micro-batch."""
    logp, _ = token_scores(graphdef, params, mb, cfg)
    mask = _steps(mb.loss_mask_BxPxT) * (rows.weight_N > 0)[:, None]
    loss, metrics = losses.sft_objective(logp, mask, cfg.loss.aggregation, UNIT)
    return loss, (metrics, None, None, losses.denominators(mask))


def accumulate(graphdef, cfg: TrainerConfig, params, acc: Accumulator, mb: TrainBatch,
               rows: RowTargets) -> Accumulator:
    """acc + this micro-batch's gradient sums, metric sums and counts."""
    loss_fn = rl_loss if cfg.mode == "rl" else sft_loss
    grad_fn = jax.grad(lambda p: loss_fn(graphdef, cfg, p, mb, rows), has_aux=True)
    grads, (metrics, mismatch, signs, counts) = grad_fn(params)
    return jax.tree.map(jnp.add, acc, Accumulator(grads, metrics, mismatch, signs, counts))


def apply(cfg: TrainerConfig, state: TrainState, acc: Accumulator):
    """Divide the sums by the global counts and take one AdamW step: (state, metrics)."""
    opt = FusedAdamW(cfg.optimizer)
    lr = opt.lr(state.opt_state)
    scale = 1.0 / acc.counts.of(cfg.loss.aggregation)
    params, opt_state, grad_norm = opt.update(state.params, state.opt_state, acc.grads, scale)
    metrics = losses.finalize(acc.sums, acc.counts, cfg.loss.aggregation)
    if acc.mismatch is not None:
        metrics |= mismatch_metrics(acc.mismatch)
    if acc.signs is not None:
        metrics |= sign_metrics(acc.signs)
    metrics |= {"optim/grad_norm": grad_norm, "optim/lr": lr,
                "optim/tokens": acc.counts.tokens, "optim/rows": acc.counts.seqs}
    return TrainState(state.step + 1, params, opt_state), metrics


# ---- compiled, sharded ----------------------------------------------------------------

def _replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def _shape_key(tree) -> tuple:
    leaves, treedef = jax.tree.flatten(tree)
    return (treedef, tuple((tuple(x.shape), str(x.dtype)) for x in leaves))


class TrainFunctions:
    """The step functions of one model and config on one mesh, compiled per bucket.

    `compiles` counts XLA compilations by function name: each shape bucket compiles
    `score` and `accumulate` once, `apply` and `zeros` compile once in all.
    """

    def __init__(self, graphdef, abstract_params: nnx.State, cfg: TrainerConfig, mesh: Mesh):
        self.graphdef = qwen25vl.with_options(graphdef, abstract_params, remat=cfg.remat,
                                              attention=cfg.attention)
        self.cfg, self.mesh = cfg, mesh
        self.optimizer = FusedAdamW(cfg.optimizer)
        self.param_shardings = param_shardings(abstract_params, mesh)
        rep = _replicated(mesh)
        # moments are sharded as their parameters
        opt = AdamWState(rep, self.param_shardings, self.param_shardings)
        self.state_shardings = TrainState(rep, self.param_shardings, opt)
        self.compiles: dict[str, int] = {}
        self._cache: dict[tuple, Callable] = {}
        self._compiling: dict[tuple, threading.Lock] = {}  # one lock per program being compiled
        self._lock = threading.Lock()  # guards _compiling
        self._sum_shapes = None  # (metric sums, mismatch sums, sign sums, counts) a micro-batch adds

    # -- sharding helpers
    def batch_shardings(self, mb: TrainBatch) -> TrainBatch:
        return jax.tree.map(lambda s: NamedSharding(self.mesh, s), batch_specs(mb, ROWS),
                            is_leaf=lambda x: isinstance(x, PartitionSpec))

    def row_shardings(self, rows: RowTargets) -> RowTargets:
        row = NamedSharding(self.mesh, PartitionSpec(ROWS))
        return jax.tree.map(lambda _: row, rows)

    def _acc_shardings(self, acc: Accumulator) -> Accumulator:
        """Gradients sharded as their parameters; every sum and count replicated."""
        rep = _replicated(self.mesh)
        sums = jax.tree.map(lambda _: rep, (acc.sums, acc.mismatch, acc.signs, acc.counts))
        return Accumulator(self.param_shardings, *sums)

    def _compiled(self, name: str, fn, args, in_shardings, out_shardings, donate=()):
        """The executable of `fn` for these argument shapes; `out_shardings` may be a
        function of the output shapes (traced only when compiling)."""
        key = (name, _shape_key(args))
        if (exe := self._cache.get(key)) is not None:
            return exe
        with self._lock:
            compiling = self._compiling.setdefault(key, threading.Lock())
        with compiling:
            if key not in self._cache:
                if callable(out_shardings):
                    out_shardings = out_shardings(jax.eval_shape(fn, *args))
                fn.__name__ = fn.__qualname__ = f"train_{name}"  # the program's name in XLA's logs and profiles
                jitted = jax.jit(fn, in_shardings=in_shardings, out_shardings=out_shardings,
                                 donate_argnums=donate)
                with jax.set_mesh(self.mesh):
                    self._cache[key] = jitted.lower(*args).compile()
                self.compiles[name] = self.compiles.get(name, 0) + 1
        return self._cache[key]

    # -- the step functions
    def init_state(self, params: nnx.State) -> TrainState:
        fn = lambda p: TrainState(jnp.zeros((), jnp.int32), p, self.optimizer.init(p))  # noqa: E731
        return self._compiled("init", fn, (params,), (self.param_shardings,),
                              self.state_shardings)(params)

    def score(self, params, ref_params, mb: TrainBatch) -> Scores:
        return self.compile_score(params, ref_params, mb)(params, ref_params, mb)

    def compile_score(self, params, ref_params, mb: TrainBatch):
        fn = lambda p, r, b: score(self.graphdef, self.cfg, p, r, b)  # noqa: E731
        row = NamedSharding(self.mesh, PartitionSpec(ROWS))
        ref_sh = None if ref_params is None else self.param_shardings
        return self._compiled("score", fn, (params, ref_params, mb),
                              (self.param_shardings, ref_sh, self.batch_shardings(mb)),
                              lambda out: jax.tree.map(lambda _: row, out))

    def zeros(self, params, mb: TrainBatch, rows: RowTargets) -> Accumulator:
        """An empty accumulator; its metric names depend on the config, not the bucket."""
        return self.compile_zeros(params, mb, rows)()

    def compile_zeros(self, params, mb: TrainBatch, rows: RowTargets):
        return self._compiled("zeros", self._zeros_fn(params, mb, rows), (), (), self._acc_shardings)

    def accumulator_shapes(self, params, mb: TrainBatch, rows: RowTargets) -> Accumulator:
        """What `zeros` returns, as ShapeDtypeStructs (no memory)."""
        return jax.eval_shape(self._zeros_fn(params, mb, rows))

    def _zeros_fn(self, params, mb: TrainBatch, rows: RowTargets):
        if self._sum_shapes is None:
            loss_fn = rl_loss if self.cfg.mode == "rl" else sft_loss
            self._sum_shapes = jax.eval_shape(
                lambda p, b, r: loss_fn(self.graphdef, self.cfg, p, b, r)[1], params, mb, rows)
        sum_shapes = self._sum_shapes
        shapes = [(x.shape, jnp.float32) for x in jax.tree.leaves(params)]
        treedef = jax.tree.structure(params)

        def init():
            grads = jax.tree.unflatten(treedef, [jnp.zeros(*s) for s in shapes])
            sums = jax.tree.map(lambda s: jnp.zeros(s.shape, jnp.float32), sum_shapes)
            return Accumulator(grads, *sums)

        return init

    def accumulate(self, params, acc: Accumulator, mb: TrainBatch, rows: RowTargets) -> Accumulator:
        return self.compile_accumulate(params, acc, mb, rows)(params, acc, mb, rows)

    def compile_accumulate(self, params, acc: Accumulator, mb: TrainBatch, rows: RowTargets):
        """The executable `accumulate` runs for these argument shapes (arrays or
        ShapeDtypeStructs): compiled once per bucket, open to XLA's memory/cost analysis."""
        fn = lambda p, a, b, r: accumulate(self.graphdef, self.cfg, p, a, b, r)  # noqa: E731
        acc_sh = self._acc_shardings(acc)
        return self._compiled(
            "accumulate", fn, (params, acc, mb, rows),
            (self.param_shardings, acc_sh, self.batch_shardings(mb), self.row_shardings(rows)),
            acc_sh, donate=(1,))

    def apply(self, state: TrainState, acc: Accumulator) -> tuple[TrainState, dict]:
        """The next state; `state` is donated (its buffers hold the new state)."""
        return self.compile_apply(state, acc)(state, acc)

    def compile_apply(self, state: TrainState, acc: Accumulator):
        fn = lambda s, a: apply(self.cfg, s, a)  # noqa: E731
        rep = _replicated(self.mesh)
        out_sh = lambda out: (self.state_shardings, jax.tree.map(lambda _: rep, out[1]))  # noqa: E731
        return self._compiled("apply", fn, (state, acc),
                              (self.state_shardings, self._acc_shardings(acc)),
                              out_sh, donate=(0,))

