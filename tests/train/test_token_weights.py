"""The per-token gradient weight each recipe gives, written out by hand for both advantage
signs: c_t = -d loss / d log pi_t = A * g(q) at the batch's first update (pi = pi_old),
q = pi_old / pi_sampler, through step.rl_terms and losses.rl_objective as the train step
runs them (one token per row, token means, UNIT denominators)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dart_jax.train import losses, step
from dart_jax.train.config import LossConfig, TISConfig, TrainerConfig

Q = [0.5, 0.95, 1.1, 1.6, 2.5, 12.0]

# g(q) for A = +1 and A = -1
RECIPE = {  # clip against pi_old, TIS min(q, 2): the same weight whatever the sign
    +1: [0.5, 0.95, 1.1, 1.6, 2.0, 2.0],
    -1: [0.5, 0.95, 1.1, 1.6, 2.0, 2.0],
}
BEHAVIOUR = {  # the previous recipe: clip against the sampler, TIS min(q, 2)
    +1: [0.5, 0.95, 1.1, 0.0, 0.0, 0.0],  # q > 1 + 0.28: clipped, success tokens get nothing
    -1: [0.0, 0.95, 1.1, 1.6, 2.0, 0.0],  # q < 1 - 0.1: clipped; q > 10: the dual clip
}
DART = {+1: [0.5, 0.95, 1.0, 1.0, 1.0, 1.0], -1: [0.5, 0.95, 1.0, 1.0, 1.0, 1.0]}  # C = 1


def _weights(clip_to: str, cap: float, exempt: bool = False) -> dict[int, list[float]]:
    cfg = TrainerConfig(mode="rl", loss=LossConfig(kl_coef=0.0, aggregation="token_mean", clip_to=clip_to),
                        tis=TISConfig(enabled=True, cap=cap))
    n = 2 * len(Q)
    adv = jnp.array([+1.0] * len(Q) + [-1.0] * len(Q))
    old = jnp.zeros((n, 1))
    rollout = -jnp.log(jnp.array(Q + Q))[:, None]  # q = pi_old / pi_sampler
    mask = jnp.ones((n, 1))
    terms, _, _ = step.rl_terms(cfg, old, rollout, mask, jnp.full(n, exempt), adv, jnp.ones(n))

    def loss(logp):
        return losses.rl_objective(logp, jnp.zeros((n, 1)), terms, cfg.loss, losses.UNIT)[0]

    c = -np.asarray(jax.grad(loss)(old))[:, 0]  # the push on each token's log-probability
    g = c / np.asarray(adv)
    return {+1: g[:len(Q)].round(6).tolist(), -1: g[len(Q):].round(6).tolist()}


@pytest.mark.parametrize("clip_to,cap,table", [("trainer", 2.0, RECIPE), ("behaviour", 2.0, BEHAVIOUR),
                                               ("trainer", 1.0, DART)])
def test_token_weight_table(clip_to, cap, table):
    got = _weights(clip_to, cap)
    for sign in (+1, -1):
        np.testing.assert_allclose(got[sign], table[sign], atol=1e-5, err_msg=f"A = {sign}")


@pytest.mark.parametrize("clip_to", ["trainer", "behaviour"])
def test_injected_successes_weigh_as_demonstrations(clip_to):
    """Exempt steps (the pool's injected successes, demonstrations): weight 1 at any q, both
    recipes: a stale success keeps its whole push."""
    got = _weights(clip_to, 2.0, exempt=True)
    assert got == {+1: [1.0] * len(Q), -1: [1.0] * len(Q)}


def test_sign_sums_measure_the_token_level_push():
    """One success token and one failure token of equal |A|: with the recipe the pushes cancel
    (push/net 0) at q = 2.5 for both; with the behaviour clip the success is clipped, so the
    net push is all the failure's (-1), its clip fraction 1 on the success side."""
    def metrics(clip_to):
        cfg = TrainerConfig(mode="rl", loss=LossConfig(kl_coef=0.0, clip_to=clip_to), tis=TISConfig(cap=2.0))
        adv = jnp.array([1.0, -1.0])
        old = jnp.zeros((2, 1))
        rollout = jnp.full((2, 1), -np.log(2.5))
        terms, _, _ = step.rl_terms(cfg, old, rollout, jnp.ones((2, 1)), jnp.zeros(2, bool), adv, jnp.ones(2))
        return {k: float(v) for k, v in losses.sign_metrics(
            losses.sign_sums(old, terms, cfg.loss, losses.UNIT)).items()}

    m = metrics("trainer")
    assert m["push/net"] == 0.0 and m["push/pos"] == 0.5 and m["push/neg"] == 0.5
    assert m["loss/clip_frac_pos"] == 0.0 and m["loss/clip_frac_neg"] == 0.0
    assert m["tis/weight_pos"] == 2.0 and m["tis/weight_neg"] == 2.0
    b = metrics("behaviour")
    assert b["push/net"] == -1.0 and b["push/pos"] == 0.0 and b["push/neg"] == 1.0
    assert b["loss/clip_frac_pos"] == 1.0 and b["loss/clip_frac_neg"] == 0.0
