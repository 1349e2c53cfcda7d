"""Policy losses, k3 KL and aggregation: pure functions over [B, T] token arrays.

Rows are steps (B), columns tokens (T); `mask_BxT` is 1 on the response tokens that count.
Every aggregate is a sum divided by a denominator of the whole global batch (`Denominators`),
so under gradient accumulation the result is exactly the global mean (sum and denominator,
never a mean of means). With `UNIT` denominators an aggregate is the bare sum: the train
step accumulates sums and counts over micro-batches and divides once (`finalize`).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from dart_jax.train.config import Aggregation, DualClipLoss, GSPOLoss, LossConfig

_MAX_LOG_RATIO = 20.0  # exp(20) ~ 5e8: past this a ratio is noise, and exp must stay finite


@dataclasses.dataclass(frozen=True)
class Denominators:
    """Counts: masked tokens, and rows with at least one masked token (additive)."""
    tokens: jax.Array
    seqs: jax.Array

    def __add__(self, other: "Denominators") -> "Denominators":
        return Denominators(self.tokens + other.tokens, self.seqs + other.seqs)

    def of(self, mode: Aggregation) -> jax.Array:
        """The denominator `mode` divides by (at least 1)."""
        return jnp.maximum(self.tokens if mode == "token_mean" else self.seqs, 1.0)


jax.tree_util.register_dataclass(Denominators, data_fields=["tokens", "seqs"], meta_fields=[])

# numpy scalars: a JAX array made at import would start the backends before jax.distributed
UNIT = Denominators(np.float32(1.0), np.float32(1.0))


def denominators(mask_BxT: jax.Array) -> Denominators:
    """The counts of `mask_BxT`; add them up over every micro-batch of the global batch."""
    tokens = mask_BxT.sum()
    seqs = (mask_BxT.sum(axis=-1) > 0).sum()
    return Denominators(tokens.astype(jnp.float32), seqs.astype(jnp.float32))


def aggregate(x_BxT: jax.Array, mask_BxT: jax.Array, mode: Aggregation,
              denom: Denominators, weight_B: jax.Array | None = None) -> jax.Array:
    """This micro-batch's share of the global mean.

    token_mean:           sum_bt w_b m_bt x_bt / N_tokens
    seq_mean_token_mean:  sum_b w_b (sum_t m_bt x_bt / max(sum_t m_bt, 1)) / N_seqs
    """
    w_B = jnp.ones(x_BxT.shape[:1], x_BxT.dtype) if weight_B is None else weight_B
    masked_BxT = jnp.where(mask_BxT > 0, x_BxT, 0.0) * mask_BxT
    if mode == "token_mean":
        return jnp.sum(w_B * masked_BxT.sum(axis=-1)) / denom.of(mode)
    if mode == "seq_mean_token_mean":
        per_seq_B = masked_BxT.sum(axis=-1) / jnp.maximum(mask_BxT.sum(axis=-1), 1.0)
        return jnp.sum(w_B * per_seq_B) / denom.of(mode)
    raise ValueError(f"unknown aggregation {mode!r}")


def dual_clip_loss(logp_BxT, logp_old_BxT, adv_B, mask_BxT, cfg: DualClipLoss):
    """Dual-clip PPO per token; returns (loss_BxT, clipped_BxT).

        r = exp(logp - logp_old)
        l = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))
        l = min(l, -A c)            where A < 0 (the dual clip bounds the loss by c |A|)
    """
    del mask_BxT
    adv = adv_B[:, None]
    ratio = jnp.exp(jnp.clip(logp_BxT - logp_old_BxT, -_MAX_LOG_RATIO, _MAX_LOG_RATIO))
    l1 = -adv * ratio
    l2 = -adv * jnp.clip(ratio, 1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
    clipped = jnp.maximum(l1, l2)
    l3 = -adv * cfg.clip_c
    loss = jnp.where(adv < 0, jnp.minimum(clipped, l3), clipped)
    return loss, (l2 > l1) | ((adv < 0) & (clipped > l3))


def gspo_loss(logp_BxT, logp_old_BxT, adv_B, mask_BxT, cfg: GSPOLoss):
    """GSPO: one clipped ratio per sequence; returns (loss_BxT, clipped_BxT).

        s_b = exp(sum_t m (logp - logp_old) / sum_t m)      (geometric mean of token ratios)
        token form: s_bt = sg(s_b) exp(logp_bt - sg(logp_bt)), so d s_bt = s_b d logp_bt
        l = max(-A s_bt, -A clip(s_bt, 1 - eps_low, 1 + eps_high))
    Aggregated with seq_mean_token_mean this is exactly the GSPO objective's gradient.
    """
    n_B = jnp.maximum(mask_BxT.sum(axis=-1), 1.0)
    log_s_B = jnp.sum(jnp.where(mask_BxT > 0, logp_BxT - logp_old_BxT, 0.0), axis=-1) / n_B
    log_s_BxT = logp_BxT - jax.lax.stop_gradient(logp_BxT) + jax.lax.stop_gradient(log_s_B)[:, None]
    s = jnp.exp(jnp.minimum(log_s_BxT, _MAX_LOG_RATIO))
    adv = adv_B[:, None]
    l1 = -adv * s
    l2 = -adv * jnp.clip(s, 1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
    return jnp.maximum(l1, l2), l2 > l1


POLICY_LOSSES: dict[str, Callable] = {"dual_clip": dual_clip_loss, "gspo": gspo_loss}


def policy_loss(cfg: DualClipLoss | GSPOLoss, logp_BxT, logp_old_BxT, adv_B, mask_BxT):
    """The policy loss named by `cfg.type`: (loss_BxT, clipped_BxT)."""
    return POLICY_LOSSES[cfg.type](logp_BxT, logp_old_BxT, adv_B, mask_BxT, cfg)


def k3_kl(logp_BxT: jax.Array, logp_ref_BxT: jax.Array) -> jax.Array:
    """k3 estimator of KL(pi || pi_ref) per token: exp(d) - d - 1 with d = logp_ref - logp.

    Unbiased for samples from pi, always >= 0; d is clipped to +-20 so exp stays finite.
    """
    d = jnp.clip(logp_ref_BxT - logp_BxT, -_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    return jnp.exp(d) - d - 1.0


@dataclasses.dataclass(frozen=True)
class RLTerms:
    """Per-token inputs of the RL objective for one micro-batch."""
    logp_old_BxT: jax.Array  # trainer logprobs before this batch's first update (stop-gradient)
    adv_B: jax.Array
    mask_BxT: jax.Array  # response tokens of selected steps
    weight_B: jax.Array  # per-step weight (selection, trajectory normalization)
    tis_BxT: jax.Array  # truncated importance weights (ones when TIS is off)
    logp_ref_BxT: jax.Array | None = None
    # the policy the clip measures the ratio against (loss.clip_to "behaviour": the sampler's
    # logprobs); None: logp_old_BxT
    logp_clip_BxT: jax.Array | None = None


jax.tree_util.register_dataclass(
    RLTerms, data_fields=[f.name for f in dataclasses.fields(RLTerms)], meta_fields=[])


def clipped_policy_loss(cfg: DualClipLoss | GSPOLoss, logp_BxT, terms: RLTerms):
    """The policy loss with its clip taken against `terms.logp_clip_BxT` (the behaviour
    policy), its gradient still the trainer's ratio r = pi / pi_old; (loss_BxT, clipped_BxT).

        rho = pi / pi_clip                            the ratio the clip (and dual clip) judge
        l   = dual_clip(rho) * sg(pi_clip / pi_old)   value -A r where rho is inside the clip,
                                                      gradient -A r grad log pi; 0 where outside
    With pi_clip = pi_old this is `policy_loss`. Where the policy moved since it sampled a token
    (an asynchronous batch is a version or more stale), a token already pushed past the clip is
    pushed no further; the importance weight stays truncated IS's (terms.tis_BxT), not rho.
    """
    if terms.logp_clip_BxT is None:
        return policy_loss(cfg, logp_BxT, terms.logp_old_BxT, terms.adv_B, terms.mask_BxT)
    if cfg.type != "dual_clip":
        raise ValueError(f"a clip against the behaviour policy needs the token-level dual clip, not {cfg.type}")
    loss, clipped = policy_loss(cfg, logp_BxT, terms.logp_clip_BxT, terms.adv_B, terms.mask_BxT)
    scale = jnp.exp(jnp.clip(terms.logp_clip_BxT - terms.logp_old_BxT, -_MAX_LOG_RATIO, _MAX_LOG_RATIO))
    return loss * jax.lax.stop_gradient(scale), clipped


def rl_objective(logp_BxT: jax.Array, entropy_BxT: jax.Array, terms: RLTerms,
                 cfg: LossConfig, denom: Denominators) -> tuple[jax.Array, dict[str, jax.Array]]:
    """loss = agg(w * tis * policy_loss) + kl_coef * agg(w * k3) - entropy_coef * agg(w * H).

    Returns this micro-batch's share of the loss and of each metric (all exact global means
    once summed over micro-batches). loss/ratio is the ratio the clip judges.
    """
    m, w = terms.mask_BxT, terms.weight_B
    agg = lambda x: aggregate(x, m, cfg.aggregation, denom, w)  # noqa: E731
    tok_mean = lambda x: aggregate(x, m, "token_mean", denom)  # noqa: E731
    pg_BxT, clipped_BxT = clipped_policy_loss(cfg.policy, logp_BxT, terms)
    pg = agg(terms.tis_BxT * pg_BxT)
    loss = pg
    clip_to = terms.logp_old_BxT if terms.logp_clip_BxT is None else terms.logp_clip_BxT
    metrics = {"loss/policy": pg, "loss/clip_frac": tok_mean(clipped_BxT.astype(jnp.float32)),
               "loss/entropy": tok_mean(jax.lax.stop_gradient(entropy_BxT)),
               "loss/ratio": tok_mean(jnp.exp(jnp.clip(jax.lax.stop_gradient(logp_BxT) - clip_to,
                                                       -_MAX_LOG_RATIO, _MAX_LOG_RATIO)))}
    if cfg.kl_coef > 0:
        if terms.logp_ref_BxT is None:
            raise ValueError("kl_coef > 0 needs reference logprobs")
        kl = agg(k3_kl(logp_BxT, terms.logp_ref_BxT))
        loss = loss + cfg.kl_coef * kl
        metrics["loss/kl"] = kl
    if cfg.entropy_coef > 0:
        loss = loss - cfg.entropy_coef * agg(entropy_BxT)
    metrics["loss/total"] = loss
    return loss, metrics


class SignSums(NamedTuple):
    """Additive per-token statistics of the policy term split by the sign of the advantage
    (exact under any split of the batch); `sign_metrics` turns them into the logged values.

    A token's push c_t = -d(policy term)/d log pi_t is what the update does to its
    log-probability: A times its step weight, TIS weight and aggregation share, 0 where the
    clip holds it. Step-level balance (adv/net) does not imply sum_t c_t = 0 when the token
    weights depend on the sign; push/net measures it."""
    tokens_pos: jax.Array  # masked tokens with A > 0
    tokens_neg: jax.Array  # masked tokens with A < 0
    clipped_pos: jax.Array
    clipped_neg: jax.Array
    tis_pos: jax.Array  # sum of the applied TIS weights
    tis_neg: jax.Array
    push_pos: jax.Array  # sum c_t (>= 0)
    push_neg: jax.Array  # sum c_t (<= 0)


def sign_sums(logp_BxT: jax.Array, terms: RLTerms, cfg: LossConfig, denom: Denominators) -> SignSums:
    """The SignSums of one micro-batch at the policy `logp_BxT` (no gradient flows)."""
    m = (terms.mask_BxT > 0) & (terms.weight_B[:, None] > 0)

    def policy_term(lp):
        pg_BxT, _ = clipped_policy_loss(cfg.policy, lp, terms)
        return aggregate(terms.tis_BxT * pg_BxT, terms.mask_BxT, cfg.aggregation, denom, terms.weight_B)

    lp = jax.lax.stop_gradient(logp_BxT)
    push_BxT = -jax.grad(policy_term)(lp)
    _, clipped_BxT = clipped_policy_loss(cfg.policy, lp, terms)
    pos, neg = m & (terms.adv_B[:, None] > 0), m & (terms.adv_B[:, None] < 0)
    s = lambda x, sel: jnp.sum(jnp.where(sel, x, 0.0))  # noqa: E731
    one = jnp.ones_like(push_BxT)
    return jax.lax.stop_gradient(SignSums(
        s(one, pos), s(one, neg), s(clipped_BxT.astype(jnp.float32), pos),
        s(clipped_BxT.astype(jnp.float32), neg), s(terms.tis_BxT, pos), s(terms.tis_BxT, neg),
        s(push_BxT, pos), s(push_BxT, neg)))


def sign_metrics(s: SignSums) -> dict[str, jax.Array]:
    """push/net: sum_t c_t / sum_t |c_t| (0: the batch's successes and failures push every
    token they share equally hard; < 0: shared tokens go down); push/pos, push/neg: the two
    sides' shares of sum |c_t|; loss/clip_frac_{pos,neg}, tis/weight_{pos,neg}: the clipped
    fraction and the mean TIS weight of each sign's tokens."""
    total = jnp.maximum(s.push_pos - s.push_neg, 1e-30)
    per = lambda x, n: x / jnp.maximum(n, 1.0)  # noqa: E731
    return {"push/net": (s.push_pos + s.push_neg) / total, "push/pos": s.push_pos / total,
            "push/neg": -s.push_neg / total,
            "loss/clip_frac_pos": per(s.clipped_pos, s.tokens_pos),
            "loss/clip_frac_neg": per(s.clipped_neg, s.tokens_neg),
            "tis/weight_pos": per(s.tis_pos, s.tokens_pos), "tis/weight_neg": per(s.tis_neg, s.tokens_neg)}


# rl_objective's metrics that are token means whatever the aggregation mode.
TOKEN_MEAN_METRICS = frozenset({"loss/clip_frac", "loss/entropy", "loss/ratio"})


def finalize(sums: dict[str, jax.Array], counts: Denominators,
             mode: Aggregation) -> dict[str, jax.Array]:
    """Global means from objectives evaluated with UNIT denominators and summed over
    micro-batches, `counts` being the summed `denominators` of their masks."""
    return {k: v / counts.of("token_mean" if k in TOKEN_MEAN_METRICS else mode)
            for k, v in sums.items()}


def sft_objective(logp_BxT: jax.Array, mask_BxT: jax.Array, mode: Aggregation,
                  denom: Denominators) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Cross-entropy on demonstration tokens: agg(-logp)."""
    nll = aggregate(-logp_BxT, mask_BxT, mode, denom)
    return nll, {"loss/total": nll, "loss/nll": nll}
