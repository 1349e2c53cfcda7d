"""Blockwise attention in plain XLA: online softmax forward, hand-written backward.

Queries run in blocks of `block_q` positions and keys in blocks of `block_k`, every row of
the batch and every head in each block. Only [B, H, block_q, block_k] scores are alive at a
time; the forward keeps the output and each query's log-sum-exp, and the backward (custom
VJP, as in FlashAttention-2) recomputes the probabilities block by block:

    p = exp(s - lse),  D = rowsum(dO * O)
    dV += p^T dO,  dS = p * (dO V^T - D),  dQ += dS K * scale,  dK += dS^T Q * scale

A query block visits only the key blocks that can hold one of its keys: those whose range of
segment ids overlaps its own (and, when causal, that start at or before its last position).
With non-decreasing segment ids (the decoder's single run of tokens, the vision tower's
images in slot order) the visited blocks are contiguous, so attention restricted to each
image costs time linear in the number of images, and memory linear in the length.

Segment semantics: query t sees key s iff seg_q[t] == seg_kv[s] >= 0 (and s <= t when
causal). A query that sees no key (padding) gets a zero output and no gradient.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

_F32 = jnp.float32
_NEG = -1e30  # finite "minus infinity": exp(_NEG - m) underflows to 0 without NaNs
_BIG = 2**30


def flash_attention(q_BxTxHxK, k_BxSxGxK, v_BxSxGxK, seg_q_BxT, seg_kv_BxS, *, causal: bool,
                    block_q: int = 512, block_k: int = 512) -> jax.Array:
    """Attention output [B, T, H, K] in q's dtype; lengths need not divide the blocks."""
    T, S = q_BxTxHxK.shape[1], k_BxSxGxK.shape[1]
    bq, bk = min(block_q, T), min(block_k, S)
    q, seg_q = _pad_to(q_BxTxHxK, seg_q_BxT, bq)
    k, _ = _pad_to(k_BxSxGxK, seg_kv_BxS, bk)
    v, seg_kv = _pad_to(v_BxSxGxK, seg_kv_BxS, bk)
    out = _flash(q, k, v, seg_q.astype(jnp.int32), seg_kv.astype(jnp.int32), causal, bq, bk)
    return out[:, :T]


def _pad_to(x_BxNx___, seg_BxN, block: int):
    n = x_BxNx___.shape[1]
    extra = -n % block
    if not extra:
        return x_BxNx___, seg_BxN
    widths = [(0, 0), (0, extra)] + [(0, 0)] * (x_BxNx___.ndim - 2)
    return jnp.pad(x_BxNx___, widths), jnp.pad(seg_BxN, ((0, 0), (0, extra)), constant_values=-1)


# ---- which blocks meet ----------------------------------------------------------------

def _seg_range(seg_BxN, block: int):
    """(lowest, highest) valid segment id of each block [B, N / block]; (BIG, -1) if none."""
    s = seg_BxN.reshape(seg_BxN.shape[0], -1, block)
    valid = s >= 0
    return jnp.min(jnp.where(valid, s, _BIG), -1), jnp.max(jnp.where(valid, s, -1), -1)


def _meets(seg_q, seg_kv, causal, bq, bk):
    """[nq, nk]: does any row have a query of block i that may see a key of block j."""
    q_lo, q_hi = _seg_range(seg_q, bq)
    k_lo, k_hi = _seg_range(seg_kv, bk)
    meet = (q_lo[:, :, None] <= k_hi[:, None, :]) & (k_lo[:, None, :] <= q_hi[:, :, None])
    meet = jnp.any(meet, axis=0)
    if causal:
        nq, nk = meet.shape
        meet &= (jnp.arange(nk) * bk)[None, :] <= (jnp.arange(nq) * bq + bq - 1)[:, None]
    return meet


def _span(meet_AxN):
    """[first, last + 1) of the True entries of each row (empty rows: [0, 0))."""
    n = meet_AxN.shape[1]
    first = jnp.argmax(meet_AxN, axis=1)
    end = n - jnp.argmax(meet_AxN[:, ::-1], axis=1)
    some = jnp.any(meet_AxN, axis=1)
    return jnp.where(some, first, 0), jnp.where(some, end, 0)


# ---- one block of scores --------------------------------------------------------------

def _block(x, start, size, axis=1):
    return lax.dynamic_slice_in_dim(x, start, size, axis=axis)


def _mask(sq_Bxq, sk_Bxk, q0, k0, causal):
    m = (sq_Bxq[:, :, None] == sk_Bxk[:, None, :]) & (sk_Bxk >= 0)[:, None, :]
    if causal:
        qpos = q0 + jnp.arange(sq_Bxq.shape[1])
        kpos = k0 + jnp.arange(sk_Bxk.shape[1])
        m &= (qpos[:, None] >= kpos[None, :])[None]
    return m[:, None, None]  # [B, 1, 1, q, k]: broadcast over (G, R)


def _scores(q_BxqxGxRxK, k_BxkxGxK, scale):
    return jnp.einsum("bqgrd,bkgd->bgrqk", q_BxqxGxRxK, k_BxkxGxK, preferred_element_type=_F32) * scale


def _grouped(x_BxNxHxK, groups):
    b, n, h, d = x_BxNxHxK.shape
    return x_BxNxHxK.reshape(b, n, groups, h // groups, d)


# ---- forward --------------------------------------------------------------------------

def _forward(q, k, v, seg_q, seg_kv, causal, bq, bk):
    B, T, H, K = q.shape
    G = k.shape[2]
    scale = K**-0.5
    j0, j1 = _span(_meets(seg_q, seg_kv, causal, bq, bk))

    def q_block(i, outs):
        out, lse = outs
        q_i = _grouped(_block(q, i * bq, bq), G)
        sq = _block(seg_q, i * bq, bq)

        def kv_block(j, carry):
            m, l, acc = carry
            s = _scores(q_i, _block(k, j * bk, bk), scale)
            mask = _mask(sq, _block(seg_kv, j * bk, bk), i * bq, j * bk, causal)
            m_new = jnp.maximum(m, jnp.max(jnp.where(mask, s, _NEG), axis=-1))
            p = jnp.where(mask, jnp.exp(s - m_new[..., None]), 0.0)
            corr = jnp.exp(m - m_new)
            pv = jnp.einsum("bgrqk,bkgd->bgrqd", p.astype(v.dtype), _block(v, j * bk, bk),
                            preferred_element_type=_F32)
            return m_new, corr * l + jnp.sum(p, axis=-1), corr[..., None] * acc + pv

        shape = (B, G, H // G, bq)
        init = (jnp.full(shape, _NEG, _F32), jnp.zeros(shape, _F32), jnp.zeros(shape + (K,), _F32))
        m, l, acc = lax.fori_loop(j0[i], j1[i], kv_block, init)
        o = jnp.where(l[..., None] > 0, acc / jnp.where(l > 0, l, 1.0)[..., None], 0.0)
        o_BxqxHxK = o.transpose(0, 3, 1, 2, 4).reshape(B, bq, H, K).astype(out.dtype)
        lse_i = jnp.where(l > 0, m + jnp.log(jnp.where(l > 0, l, 1.0)), _NEG)
        lse_i = lse_i.transpose(0, 3, 1, 2).reshape(B, bq, H)
        return (lax.dynamic_update_slice_in_dim(out, o_BxqxHxK, i * bq, axis=1),
                lax.dynamic_update_slice_in_dim(lse, lse_i, i * bq, axis=1))

    init = (jnp.zeros(q.shape, q.dtype), jnp.zeros((B, T, H), _F32))
    return lax.fori_loop(0, T // bq, q_block, init)


# ---- backward -------------------------------------------------------------------------

def _backward(q, k, v, seg_q, seg_kv, out, lse, d_out, causal, bq, bk):
    B, T, H, K = q.shape
    S, G = k.shape[1], k.shape[2]
    scale = K**-0.5
    i0, i1 = _span(_meets(seg_q, seg_kv, causal, bq, bk).T)
    delta = jnp.sum(d_out.astype(_F32) * out.astype(_F32), axis=-1)  # [B, T, H]
    grouped_rows = lambda x, i: _grouped(_block(x, i * bq, bq), G)  # noqa: E731
    heads_first = lambda x: x.reshape(B, bq, G, H // G).transpose(0, 2, 3, 1)  # noqa: E731

    def kv_block(j, grads):
        dq, dk, dv = grads
        k_j, v_j, sk = _block(k, j * bk, bk), _block(v, j * bk, bk), _block(seg_kv, j * bk, bk)

        def q_block(i, carry):
            dq, dk_j, dv_j = carry
            q_i, do_i = grouped_rows(q, i), grouped_rows(d_out, i)
            s = _scores(q_i, k_j, scale)
            mask = _mask(_block(seg_q, i * bq, bq), sk, i * bq, j * bk, causal)
            p = jnp.where(mask, jnp.exp(s - heads_first(_block(lse, i * bq, bq))[..., None]), 0.0)
            dp = jnp.einsum("bqgrd,bkgd->bgrqk", do_i, v_j, preferred_element_type=_F32)
            ds = (p * (dp - heads_first(_block(delta, i * bq, bq))[..., None])).astype(q.dtype)
            dv_j += jnp.einsum("bgrqk,bqgrd->bkgd", p.astype(q.dtype), do_i, preferred_element_type=_F32)
            dk_j += jnp.einsum("bgrqk,bqgrd->bkgd", ds, q_i, preferred_element_type=_F32) * scale
            dq_i = jnp.einsum("bgrqk,bkgd->bqgrd", ds, k_j, preferred_element_type=_F32) * scale
            dq_i = _block(dq, i * bq, bq) + dq_i.reshape(B, bq, H, K)
            return lax.dynamic_update_slice_in_dim(dq, dq_i, i * bq, axis=1), dk_j, dv_j

        zeros = jnp.zeros((B, bk, G, K), _F32)
        dq, dk_j, dv_j = lax.fori_loop(i0[j], i1[j], q_block, (dq, zeros, zeros))
        return (dq, lax.dynamic_update_slice_in_dim(dk, dk_j, j * bk, axis=1),
                lax.dynamic_update_slice_in_dim(dv, dv_j, j * bk, axis=1))

    init = (jnp.zeros(q.shape, _F32), jnp.zeros(k.shape, _F32), jnp.zeros(v.shape, _F32))
    dq, dk, dv = lax.fori_loop(0, S // bk, kv_block, init)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7))
def _flash(q, k, v, seg_q, seg_kv, causal, bq, bk):
    return _forward(q, k, v, seg_q, seg_kv, causal, bq, bk)[0]


def _flash_fwd(q, k, v, seg_q, seg_kv, causal, bq, bk):
    out, lse = _forward(q, k, v, seg_q, seg_kv, causal, bq, bk)
    return out, (q, k, v, seg_q, seg_kv, out, lse)


def _flash_bwd(causal, bq, bk, res, d_out):
    q, k, v, seg_q, seg_kv, out, lse = res
    dq, dk, dv = _backward(q, k, v, seg_q, seg_kv, out, lse, d_out, causal, bq, bk)
    return dq, dk, dv, None, None


_flash.defvjp(_flash_fwd, _flash_bwd)
