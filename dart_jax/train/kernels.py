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
independent of T x V. The sampled token's logit and the one-hot part of the gradient touch
one column per token, so they are a gather (w[:, y]) and a scatter-add outside the vocab
loop, and the blocks are pure dense math. Chunk sizes need not divide T or V: full chunks
run in a loop and the remainder is one more, smaller, static block (nothing is padded).

Matmuls run in the inputs' dtype (bf16 compute is an input cast) and accumulate in fp32;
softmax arithmetic is fp32.

Chunk sizes trade the block's memory against the loops' overhead; `auto_chunks` picks them
per backend and shape (measured on one H100 at 4k tokens x 151,936 vocab: 1024 x 8192 blocks
ran 1.07-1.2x slower than the naive full-logits version, 4096 x 16384 blocks 1.2-1.36x
faster; on CPU 1024 x 8192 is faster than naive, see benchmarks/gpu/loss_kernel.py).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from dart_jax.train.config import KernelConfig

_F32 = jnp.float32
_NEG = -1e30  # finite "minus infinity": keeps (m_old - m_new) * 0 well defined
# backend -> (tokens, vocab entries) of one block; TPU takes the GPU's large blocks (unmeasured)
_CHUNKS = {"gpu": (4096, 16384), "tpu": (4096, 16384), "cpu": (1024, 8192)}


def auto_chunks(backend: str, tokens: int, vocab: int) -> tuple[int, int]:
    """(chunk_tokens, chunk_vocab) for `tokens` x `vocab` logits on `backend`: the backend's
    block, no larger than the problem, and the vocab split into equal chunks (multiples of
    128 where the vocab allows) so that no small remainder block runs on its own."""
    ct, cv = _CHUNKS.get(backend, _CHUNKS["cpu"])
    per_chunk = -(-vocab // -(-vocab // cv))  # ceil(V / number of chunks)
    return min(ct, tokens), min(vocab, -(-per_chunk // 128) * 128)


def token_logprobs_entropy(hidden_TxD: jax.Array, w_DxV: jax.Array, tokens_T: jax.Array,
                           temperature_T: jax.Array | float = 1.0, *, chunk_tokens: int = 1024,
                           chunk_vocab: int = 8192, entropy_grad: bool = False
                           ) -> tuple[jax.Array, jax.Array]:
    """(logp_T, entropy_T) in fp32, differentiable in hidden_TxD and w_DxV (not temperature).

    Token ids must lie in [0, V); others are clipped into range (mask them out of any loss). With
    `entropy_grad=False` the entropy is a metric only: no gradient flows through it.
    """
    logp, ent = token_logprobs_entropy_BxT(
        hidden_TxD[None], w_DxV, tokens_T[None],
        jnp.broadcast_to(jnp.asarray(temperature_T, _F32), tokens_T.shape)[None],
        chunk_tokens=chunk_tokens, chunk_vocab=chunk_vocab, entropy_grad=entropy_grad)
    return logp[0], ent[0]


def token_logprobs_entropy_BxT(hidden_BxTxD: jax.Array, w_DxV: jax.Array, tokens_BxT: jax.Array,
                               temperature_BxT: jax.Array | float = 1.0, *,
                               chunk_tokens: int = 1024, chunk_vocab: int = 8192,
                               entropy_grad: bool = False) -> tuple[jax.Array, jax.Array]:
    """Batched form: [B, T, D] hidden, [B, T] tokens, temperatures broadcastable to [B, T].

    Chunks run along T with every row in each block (chunk_tokens // B positions of each
    row, chunk_tokens tokens in all), so a batch sharded over its rows stays sharded.
    """
    B, T = tokens_BxT.shape
    V = w_DxV.shape[1]
    ct, cv = min(max(1, chunk_tokens // B), T), min(chunk_vocab, V)
    tau_BxT = jnp.broadcast_to(jnp.asarray(temperature_BxT, _F32), (B, T))
    logp, ent = _fused(hidden_BxTxD, w_DxV, tokens_BxT.astype(jnp.int32), tau_BxT, ct, cv,
                       bool(entropy_grad))
    return logp, (ent if entropy_grad else lax.stop_gradient(ent))


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

def _over_chunks(total: int, size: int, body, carry):
    """carry = body(start, width, carry) over [0, total) in chunks of `size`: a loop over
    the full chunks (traced start), then the remainder (static start and width)."""
    n, tail = divmod(total, size)
    if n:
        carry = lax.fori_loop(0, n, lambda i, c: body(i * size, size, c), carry)
    return body(n * size, tail, carry) if tail else carry


def _block_logits(h_BxcxD, w_DxV, v0, cv, tau_Bxc):
    w_Dxc = lax.dynamic_slice_in_dim(w_DxV, v0, cv, axis=1)
    z = jnp.einsum("btd,dv->btv", h_BxcxD, w_Dxc, preferred_element_type=_F32)
    return z / tau_Bxc[..., None], w_Dxc


def _target_logits(h_BxcxD, w_DxV, tok_Bxc, tau_Bxc):
    """z[t, y_t] = h_t . w[:, y_t] / tau_t, one gathered column per token."""
    w_yBxcxD = jnp.take(w_DxV, tok_Bxc, axis=1, mode="clip").transpose(1, 2, 0)
    dot = jnp.einsum("btd,btd->bt", h_BxcxD.astype(_F32), w_yBxcxD.astype(_F32))
    return dot / tau_Bxc


# ---- forward --------------------------------------------------------------------------

def _rows_forward(h_BxcxD, tok_Bxc, tau_Bxc, w_DxV, cv):
    """Online logsumexp over vocab chunks for one token chunk -> (logp, ent, lse) [B, c]."""

    def body(v0, width, carry):
        m, s, u = carry  # running max, sum e^(z-m), sum e^(z-m)(z-m)
        z, _ = _block_logits(h_BxcxD, w_DxV, v0, width, tau_Bxc)
        m_new = jnp.maximum(m, z.max(axis=-1))
        scale = jnp.exp(m - m_new)
        zs = z - m_new[..., None]
        e = jnp.exp(zs)
        # a dot, not sum(e * zs): XLA:CPU fuses that second reduction ~10x slower
        u = scale * (u + (m - m_new) * s) + jnp.einsum("btv,btv->bt", e, zs)
        s = scale * s + jnp.sum(e, axis=-1)
        return m_new, s, u

    zeros = jnp.zeros(tok_Bxc.shape, _F32)
    init = (jnp.full(tok_Bxc.shape, _NEG, _F32), zeros, zeros)
    m, s, u = _over_chunks(w_DxV.shape[1], cv, body, init)
    lse = m + jnp.log(s)
    return _target_logits(h_BxcxD, w_DxV, tok_Bxc, tau_Bxc) - lse, jnp.log(s) - u / s, lse


def _forward(h_BxTxD, w_DxV, tok_BxT, tau_BxT, ct, cv):
    def body(t0, width, outs):
        h, tok, tau = (lax.dynamic_slice_in_dim(x, t0, width, axis=1)
                       for x in (h_BxTxD, tok_BxT, tau_BxT))
        return tuple(lax.dynamic_update_slice_in_dim(o, r, t0, axis=1)
                     for o, r in zip(outs, _rows_forward(h, tok, tau, w_DxV, cv)))

    zeros = jnp.zeros(tok_BxT.shape, _F32)
    return _over_chunks(tok_BxT.shape[1], ct, body, (zeros, zeros, zeros))


# ---- custom VJP -----------------------------------------------------------------------

@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _fused(h_BxTxD, w_DxV, tok_BxT, tau_BxT, ct, cv, entropy_grad):
    logp, ent, _ = _forward(h_BxTxD, w_DxV, tok_BxT, tau_BxT, ct, cv)
    return logp, ent


def _fused_fwd(h_BxTxD, w_DxV, tok_BxT, tau_BxT, ct, cv, entropy_grad):
    logp, ent, lse = _forward(h_BxTxD, w_DxV, tok_BxT, tau_BxT, ct, cv)
    return (logp, ent), (h_BxTxD, w_DxV, tok_BxT, tau_BxT, lse, ent)


def _fused_bwd(ct, cv, entropy_grad, res, g):
    h_BxTxD, w_DxV, tok_BxT, tau_BxT, lse_BxT, ent_BxT = res
    g_logp_BxT, g_ent_BxT = g
    cdt = h_BxTxD.dtype

    def rows(t0, width, carry):
        dh_BxTxD, dw_DxV = carry
        sl = lambda x: lax.dynamic_slice_in_dim(x, t0, width, axis=1)  # noqa: E731
        h, tok, tau, lse, ent, g_lp, g_h = map(sl, (h_BxTxD, tok_BxT, tau_BxT, lse_BxT, ent_BxT,
                                                   g_logp_BxT, g_ent_BxT))
        # dense part: dL/dz = -p (g_logp + g_ent (log p + H)); the one-hot part comes after
        g_lp_tau = g_lp / tau

        def cols(v0, cw, carry):
            dh_c, dw = carry
            z, w_Dxc = _block_logits(h, w_DxV, v0, cw, tau)
            logp = z - lse[..., None]
            p = jnp.exp(logp)
            if entropy_grad:
                gz = -p * ((g_lp + g_h * ent)[..., None] + g_h[..., None] * logp) / tau[..., None]
            else:
                gz = -p * g_lp_tau[..., None]
            gz = gz.astype(cdt)
            dh_c = dh_c + jnp.einsum("btv,dv->btd", gz, w_Dxc, preferred_element_type=_F32)
            dw_c = lax.dynamic_slice_in_dim(dw, v0, cw, axis=1)
            dw_c = dw_c + jnp.einsum("btd,btv->dv", h, gz, preferred_element_type=_F32)
            return dh_c, lax.dynamic_update_slice_in_dim(dw, dw_c, v0, axis=1)

        dh_c, dw_DxV = _over_chunks(w_DxV.shape[1], cv, cols,
                                    (jnp.zeros(h.shape, _F32), dw_DxV))
        # one-hot part: g_logp / tau on column y_t of each row
        w_y = jnp.take(w_DxV, tok, axis=1, mode="clip").transpose(1, 2, 0).astype(_F32)
        dh_c = dh_c + g_lp_tau[..., None] * w_y
        h_g = (h.astype(_F32) * g_lp_tau[..., None]).reshape(-1, h.shape[-1])
        dw_DxV = dw_DxV.at[:, tok.reshape(-1)].add(h_g.T, mode="clip")
        dh_BxTxD = lax.dynamic_update_slice_in_dim(dh_BxTxD, dh_c.astype(dh_BxTxD.dtype), t0,
                                                   axis=1)
        return dh_BxTxD, dw_DxV

    init = (jnp.zeros(h_BxTxD.shape, h_BxTxD.dtype), jnp.zeros(w_DxV.shape, _F32))
    dh_BxTxD, dw_DxV = _over_chunks(tok_BxT.shape[1], ct, rows, init)
    return dh_BxTxD, dw_DxV.astype(w_DxV.dtype), None, jnp.zeros_like(tau_BxT)


_fused.defvjp(_fused_fwd, _fused_bwd)


def kernel_chunks(cfg: KernelConfig, backend: str, tokens: int, vocab: int) -> tuple[int, int]:
    """(chunk_tokens, chunk_vocab) for `tokens` x `vocab` logits on `backend` ("cpu", "gpu",
    "tpu"): the configured sizes, the unset ones chosen for the backend and shape."""
    ct, cv = auto_chunks(backend, tokens, vocab)
    return cfg.chunk_tokens or ct, cfg.chunk_vocab or cv
