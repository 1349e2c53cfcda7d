"""Token log-probs and entropies from final hidden states, never building [T, V] logits.

For hidden states h_TxD, the LM head w_DxV, the sampled tokens y_T and each token's
sampling temperature tau_T (the rollout divides logits by it before sampling):

    z_TxV = (h_TxD @ w_DxV) / tau_T[:, None]
    logp_T[t]    = z[t, y_t] - logsumexp_v z[t, v]
    entropy_T[t] = -sum_v p[t, v] log p[t, v],  p = softmax(z[t])

The forward walks token chunks (rows) and, inside each, vocabulary chunks (columns) with
an online log-sum-exp, so it keeps one [chunk_tokens, chunk_vocab] block alive. The
backward (custom VJP) recomputes each block from h and w and the saved per-token
log-sum-exp, and accumulates

    dL/dz[t, v] = g_logp[t] (1[v = y_t] - p[t, v]) - g_ent[t] p[t, v] (log p[t, v] + H[t])
    dL/dh = (dL/dz / tau) @ w.T,   dL/dw = h.T @ (dL/dz / tau)

block by block into dw_DxV and dh_TxD. Temporary memory is O(chunk_tokens x chunk_vocab),
independent of T x V. Chunk sizes need not divide T or V: the last chunk is moved back to
end at the boundary and the rows/columns it shares with the previous chunk are masked, so
nothing is padded or copied.

Matmuls run in the inputs' dtype (bf16 compute is an input cast) and accumulate in fp32;
softmax arithmetic is fp32.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax

_F32 = jnp.float32
_NEG = -1e30  # finite "minus infinity": keeps (m_old - m_new) * 0 well defined


def token_logprobs_entropy(hidden_TxD: jax.Array, w_DxV: jax.Array, tokens_T: jax.Array,
                           temperature_T: jax.Array | float = 1.0, *, chunk_tokens: int = 1024,
                           chunk_vocab: int = 8192, entropy_grad: bool = False
                           ) -> tuple[jax.Array, jax.Array]:
    """(logp_T, entropy_T) in fp32, differentiable in hidden_TxD and w_DxV (not temperature).

    Tokens outside [0, V) give logp = -logsumexp (mask them out of any loss). With
    `entropy_grad=False` the entropy is a metric only: no gradient flows through it.
    """
    T, V = hidden_TxD.shape[0], w_DxV.shape[1]
    ct, cv = min(chunk_tokens, T), min(chunk_vocab, V)
    tau_T = jnp.broadcast_to(jnp.asarray(temperature_T, _F32), (T,))
    logp_T, ent_T = _fused(hidden_TxD, w_DxV, tokens_T.astype(jnp.int32), tau_T,
                           ct, cv, bool(entropy_grad))
    return logp_T, (ent_T if entropy_grad else lax.stop_gradient(ent_T))


def token_logprobs_entropy_BxT(hidden_BxTxD: jax.Array, w_DxV: jax.Array, tokens_BxT: jax.Array,
                               temperature_B: jax.Array | float = 1.0, **kwargs
                               ) -> tuple[jax.Array, jax.Array]:
    """`token_logprobs_entropy` over a batch: [B, T, D] hidden, [B, T] tokens, per-row
    temperatures [B] -> ([B, T], [B, T])."""
    B, T, D = hidden_BxTxD.shape
    tau_BxT = jnp.broadcast_to(jnp.asarray(temperature_B, _F32).reshape(-1, 1), (B, T))
    logp, ent = token_logprobs_entropy(hidden_BxTxD.reshape(B * T, D), w_DxV,
                                       tokens_BxT.reshape(B * T), tau_BxT.reshape(B * T), **kwargs)
    return logp.reshape(B, T), ent.reshape(B, T)


def naive_token_logprobs_entropy(hidden_TxD: jax.Array, w_DxV: jax.Array, tokens_T: jax.Array,
                                 temperature_T: jax.Array | float = 1.0
                                 ) -> tuple[jax.Array, jax.Array]:
    """Reference: full [T, V] logits, log_softmax and softmax entropy (tests, benchmark)."""
    tau_T = jnp.broadcast_to(jnp.asarray(temperature_T, _F32), tokens_T.shape)
    z_TxV = jnp.dot(hidden_TxD, w_DxV, preferred_element_type=_F32) / tau_T[:, None]
    logp_TxV = jax.nn.log_softmax(z_TxV, axis=-1)
    logp_T = jnp.take_along_axis(logp_TxV, tokens_T[:, None].astype(jnp.int32), axis=-1)[:, 0]
    ent_T = -jnp.sum(jnp.exp(logp_TxV) * logp_TxV, axis=-1)
    return logp_T, ent_T


# ---- chunk geometry -------------------------------------------------------------------

def _chunk(i: jax.Array, size: int, total: int) -> tuple[jax.Array, jax.Array]:
    """Chunk i's start (clamped so it ends inside `total`) and the first index it owns."""
    return jnp.minimum(i * size, total - size), i * size


def _n_chunks(size: int, total: int) -> int:
    return math.ceil(total / size)


def _block_logits(h_cxD, w_DxV, v0, cv, tau_c):
    w_Dxc = lax.dynamic_slice_in_dim(w_DxV, v0, cv, axis=1)
    return jnp.dot(h_cxD, w_Dxc, preferred_element_type=_F32) / tau_c[:, None], w_Dxc


# ---- forward --------------------------------------------------------------------------

def _rows_forward(h_cxD, tok_c, tau_c, w_DxV, cv):
    """Online logsumexp over vocab chunks for one row chunk -> (logp_c, ent_c, lse_c)."""
    V = w_DxV.shape[1]

    def body(carry, i):
        m, s, u, tgt = carry  # running max, sum e^(z-m), sum e^(z-m)(z-m), target logit
        v0, own = _chunk(i, cv, V)
        z, _ = _block_logits(h_cxD, w_DxV, v0, cv, tau_c)
        col = v0 + jnp.arange(cv)
        valid = (col >= own)[None, :]
        z = jnp.where(valid, z, _NEG)
        m_new = jnp.maximum(m, z.max(axis=-1))
        scale = jnp.exp(m - m_new)
        zs = jnp.where(valid, z - m_new[:, None], 0.0)
        e = jnp.where(valid, jnp.exp(zs), 0.0)
        u = scale * (u + (m - m_new) * s) + jnp.sum(e * zs, axis=-1)
        s = scale * s + jnp.sum(e, axis=-1)
        hit = valid & (col[None, :] == tok_c[:, None])
        tgt = tgt + jnp.sum(jnp.where(hit, z, 0.0), axis=-1)
        return (m_new, s, u, tgt), None

    c = h_cxD.shape[0]
    init = (jnp.full((c,), _NEG, _F32), jnp.zeros((c,), _F32), jnp.zeros((c,), _F32),
            jnp.zeros((c,), _F32))
    (m, s, u, tgt), _ = lax.scan(body, init, jnp.arange(_n_chunks(cv, V)))
    lse = m + jnp.log(s)
    return tgt - lse, jnp.log(s) - u / s, lse


def _forward(h_TxD, w_DxV, tok_T, tau_T, ct, cv):
    T = h_TxD.shape[0]

    def body(i, outs):
        t0, _ = _chunk(i, ct, T)
        h, tok, tau = (lax.dynamic_slice_in_dim(x, t0, ct) for x in (h_TxD, tok_T, tau_T))
        # Overlapping rows of the last chunk are recomputed identically; rewriting is fine.
        return tuple(lax.dynamic_update_slice_in_dim(o, r, t0, 0)
                     for o, r in zip(outs, _rows_forward(h, tok, tau, w_DxV, cv)))

    zeros = jnp.zeros((T,), _F32)
    return lax.fori_loop(0, _n_chunks(ct, T), body, (zeros, zeros, zeros))


# ---- custom VJP -----------------------------------------------------------------------

@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _fused(h_TxD, w_DxV, tok_T, tau_T, ct, cv, entropy_grad):
    logp, ent, _ = _forward(h_TxD, w_DxV, tok_T, tau_T, ct, cv)
    return logp, ent


def _fused_fwd(h_TxD, w_DxV, tok_T, tau_T, ct, cv, entropy_grad):
    logp, ent, lse = _forward(h_TxD, w_DxV, tok_T, tau_T, ct, cv)
    return (logp, ent), (h_TxD, w_DxV, tok_T, tau_T, lse, ent)


def _fused_bwd(ct, cv, entropy_grad, res, g):
    h_TxD, w_DxV, tok_T, tau_T, lse_T, ent_T = res
    g_logp_T, g_ent_T = g
    T, V = h_TxD.shape[0], w_DxV.shape[1]
    cdt = h_TxD.dtype

    def rows(i, carry):
        dh_TxD, dw_DxV = carry
        t0, own_t = _chunk(i, ct, T)
        sl = lambda x: lax.dynamic_slice_in_dim(x, t0, ct)  # noqa: E731
        h, tok, tau, lse, ent, g_lp, g_h = map(sl, (h_TxD, tok_T, tau_T, lse_T, ent_T, g_logp_T,
                                                   g_ent_T))
        # Rows shared with the previous chunk contribute to dw only once.
        h_own = jnp.where((t0 + jnp.arange(ct) >= own_t)[:, None], h, 0).astype(cdt)

        def cols(carry, j):
            dh_cxD, dw = carry
            v0, own_v = _chunk(j, cv, V)
            z, w_Dxc = _block_logits(h, w_DxV, v0, cv, tau)
            col = v0 + jnp.arange(cv)
            logp = z - lse[:, None]
            p = jnp.exp(logp)
            gz = g_lp[:, None] * (jnp.where(col[None, :] == tok[:, None], 1.0, 0.0) - p)
            if entropy_grad:
                gz = gz - g_h[:, None] * p * (logp + ent[:, None])
            gz = (jnp.where((col >= own_v)[None, :], gz, 0.0) / tau[:, None]).astype(cdt)
            dh_cxD = dh_cxD + jnp.dot(gz, w_Dxc.T, preferred_element_type=_F32)
            dw_c = lax.dynamic_slice_in_dim(dw, v0, cv, axis=1)
            dw_c = dw_c + jnp.dot(h_own.T, gz, preferred_element_type=_F32)
            return (dh_cxD, lax.dynamic_update_slice_in_dim(dw, dw_c, v0, axis=1)), None

        init = (jnp.zeros((ct, h_TxD.shape[1]), _F32), dw_DxV)
        (dh_cxD, dw_DxV), _ = lax.scan(cols, init, jnp.arange(_n_chunks(cv, V)))
        dh_TxD = lax.dynamic_update_slice_in_dim(dh_TxD, dh_cxD.astype(dh_TxD.dtype), t0, 0)
        return dh_TxD, dw_DxV

    init = (jnp.zeros(h_TxD.shape, h_TxD.dtype), jnp.zeros(w_DxV.shape, _F32))
    dh_TxD, dw_DxV = lax.fori_loop(0, _n_chunks(ct, T), rows, init)
    return dh_TxD, dw_DxV.astype(w_DxV.dtype), None, jnp.zeros_like(tau_T)


_fused.defvjp(_fused_fwd, _fused_bwd)
