import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dart_jax.train.config import DualClipLoss, GSPOLoss, LossConfig
from dart_jax.train.losses import (UNIT, RLTerms, aggregate, denominators, dual_clip_loss,
                                   finalize, gspo_loss, k3_kl, rl_objective)

# one token per row: (advantage, ratio) -> hand-computed dual-clip loss (eps 0.1/0.28, c=10)
CASES = [
    (1.0, 1.5, -1.28, True),  # ratio above 1 + 0.28: clipped
    (1.0, 0.5, -0.5, False),  # positive advantage, ratio below 1: unclipped
    (-1.0, 0.5, 0.9, True),  # negative advantage, ratio below 1 - 0.1: clipped
    (-1.0, 1.2, 1.2, False),
    (-1.0, 20.0, 10.0, True),  # dual clip: loss bounded by c * |A|
    (-2.0, 4.0, 8.0, False),  # below the dual clip (c |A| = 20)
]


def test_dual_clip_hand_values_and_gradients():
    adv = jnp.array([c[0] for c in CASES])
    logp = jnp.log(jnp.array([c[1] for c in CASES]))[:, None]
    old = jnp.zeros_like(logp)
    loss, clipped = dual_clip_loss(logp, old, adv, jnp.ones_like(logp), DualClipLoss())
    np.testing.assert_allclose(loss[:, 0], [c[2] for c in CASES], rtol=1e-6)
    assert clipped[:, 0].tolist() == [c[3] for c in CASES]
    grad = jax.grad(lambda lp: dual_clip_loss(lp, old, adv, old, DualClipLoss())[0].sum())(logp)
    # d(-A r)/d logp = -A r where unclipped, 0 where a clip is active
    np.testing.assert_allclose(grad[:, 0], [0, -0.5, 0, 1.2, 0, 8.0], rtol=1e-6)


def test_gspo_uses_one_sequence_ratio():
    # tokens: ratios 1.1 and 0.9, third is padding; s = exp(mean log) = sqrt(0.99)
    logp = jnp.log(jnp.array([[1.1, 0.9, 5.0], [1.1, 0.9, 5.0]]))
    old = jnp.zeros_like(logp)
    mask = jnp.array([[1.0, 1.0, 0.0]] * 2)
    adv = jnp.array([1.0, -1.0])
    cfg = GSPOLoss(clip_low=3e-4, clip_high=4e-4)
    loss, clipped = gspo_loss(logp, old, adv, mask, cfg)
    s = np.sqrt(0.99)
    np.testing.assert_allclose(loss[0, :2], [-s, -s], rtol=1e-6)  # s < 1 - eps: A>0 unclipped
    np.testing.assert_allclose(loss[1, :2], [0.9997, 0.9997], rtol=1e-6)  # A<0: clipped
    assert clipped[1, :2].all() and not clipped[0, :2].any()
    g = jax.grad(lambda lp: aggregate(gspo_loss(lp, old, adv, mask, cfg)[0], mask,
                                      "seq_mean_token_mean", denominators(mask)))(logp)
    # GSPO gradient: -A s / |y| / N_seqs per response token of the unclipped sequence
    np.testing.assert_allclose(g, [[-s / 4, -s / 4, 0], [0, 0, 0]], rtol=1e-5, atol=1e-7)


def test_k3_kl():
    kl = k3_kl(jnp.log(jnp.array([0.5, 0.3])), jnp.log(jnp.array([0.25, 0.3])))
    np.testing.assert_allclose(kl, [0.5 + np.log(2) - 1, 0.0], atol=1e-6)


X = jnp.array([[1.0, 2.0, 9.0], [4.0, 9.0, 9.0], [3.0, 5.0, 9.0]])
MASK = jnp.array([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])


@pytest.mark.parametrize("mode,weight,want", [
    ("token_mean", None, 7 / 3),  # (1 + 2 + 4) / 3 tokens
    ("seq_mean_token_mean", None, 2.75),  # (1.5 + 4) / 2 non-empty rows
    ("token_mean", [2.0, 0.0, 5.0], 2.0),  # (2 * 3) / 3
    ("seq_mean_token_mean", [2.0, 0.0, 5.0], 1.5),  # (2 * 1.5) / 2
])
def test_aggregation_modes(mode, weight, want):
    w = None if weight is None else jnp.array(weight)
    got = aggregate(X, MASK, mode, denominators(MASK), w)
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean"])
def test_micro_batches_sum_to_the_global_mean(mode):
    x = jnp.concatenate([X, jnp.array([[10.0, 20.0, 30.0]])])
    m = jnp.concatenate([MASK, jnp.array([[1.0, 1.0, 0.0]])])
    d = denominators(m)
    whole = aggregate(x, m, mode, d)
    parts = aggregate(x[:2], m[:2], mode, d) + aggregate(x[2:], m[2:], mode, d)
    np.testing.assert_allclose(parts, whole, rtol=1e-6)
    mean_of_means = (aggregate(x[:2], m[:2], mode, denominators(m[:2]))
                     + aggregate(x[2:], m[2:], mode, denominators(m[2:]))) / 2
    assert abs(float(mean_of_means - whole)) > 0.1


def _terms(ref=None):
    return RLTerms(logp_old_BxT=jnp.zeros((2, 2)), adv_B=jnp.array([1.0, -1.0]),
                   mask_BxT=jnp.array([[1.0, 1.0], [1.0, 0.0]]), weight_B=jnp.ones(2),
                   tis_BxT=jnp.array([[1.0, 0.5], [1.0, 0.0]]), logp_ref_BxT=ref)


def test_rl_objective_composes_tis_kl_and_entropy():
    logp = jnp.log(jnp.array([[1.2, 1.2], [0.8, 1.0]]))
    ent = jnp.array([[1.0, 2.0], [3.0, 9.0]])
    ref = jnp.log(jnp.array([[0.6, 1.2], [0.8, 1.0]]))
    terms = _terms(ref)
    cfg = LossConfig(kl_coef=0.1, entropy_coef=0.01)
    loss, metrics = rl_objective(logp, ent, terms, cfg, denominators(terms.mask_BxT))
    # policy: tokens -1.2 * 1, -1.2 * 0.5, +0.9 (ratio 0.8 < 0.9 clipped) -> sum -0.9, / 3
    pg = (-1.2 - 0.6 + 0.9) / 3
    kl = (0.5 + np.log(2) - 1) / 3  # only the first token differs from the reference
    np.testing.assert_allclose(metrics["loss/policy"], pg, rtol=1e-5)
    np.testing.assert_allclose(metrics["loss/kl"], kl, rtol=1e-5)
    np.testing.assert_allclose(loss, pg + 0.1 * kl - 0.01 * 2.0, rtol=1e-5)
    np.testing.assert_allclose(metrics["loss/clip_frac"], 1 / 3, rtol=1e-6)


def test_rl_objective_without_kl_needs_no_reference():
    loss, metrics = rl_objective(jnp.zeros((2, 2)), jnp.zeros((2, 2)), _terms(),
                                 LossConfig(kl_coef=0.0), denominators(_terms().mask_BxT))
    assert "loss/kl" not in metrics
    with pytest.raises(ValueError, match="reference"):
        rl_objective(jnp.zeros((2, 2)), jnp.zeros((2, 2)), _terms(), LossConfig(kl_coef=0.1),
                     denominators(_terms().mask_BxT))


def test_unit_sums_finalize_to_the_global_means():
    """What the train step does: bare sums per micro-batch, one division at the end."""
    logp = jnp.log(jnp.array([[1.2, 1.2], [0.8, 1.0]]))
    ent = jnp.array([[1.0, 2.0], [3.0, 9.0]])
    terms = _terms(jnp.zeros((2, 2)))
    cfg = LossConfig(kl_coef=0.1, aggregation="seq_mean_token_mean")
    whole_loss, whole = rl_objective(logp, ent, terms, cfg, denominators(terms.mask_BxT))
    rows = [jax.tree.map(lambda x: x[i:i + 1], terms) for i in range(2)]
    parts = [rl_objective(logp[i:i + 1], ent[i:i + 1], rows[i], cfg, UNIT)[1] for i in range(2)]
    sums = jax.tree.map(lambda a, b: a + b, *parts)
    counts = denominators(rows[0].mask_BxT) + denominators(rows[1].mask_BxT)
    got = finalize(sums, counts, cfg.aggregation)
    for key, val in whole.items():
        np.testing.assert_allclose(got[key], val, rtol=1e-6, atol=1e-7, err_msg=key)
    np.testing.assert_allclose(got["loss/total"], whole_loss, rtol=1e-6, atol=1e-7)
