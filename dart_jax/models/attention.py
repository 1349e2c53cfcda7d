"""One attention function for the decoder and the vision tower, its kernel chosen per backend.

    out_BxTxHxK = attention(q_BxTxHxK, k_BxSxGxK, v_BxSxGxK, seg_q_BxT, seg_kv_BxS,
                            causal=True, impl="auto", single_segment=True)

Who attends to whom is said by segment ids, never by a dense mask: query t sees key s iff
seg_q[t] == seg_kv[s] >= 0 (and s <= t when causal). Negative ids mark padding; a padding
query's output is unspecified. Query head h reads KV head h // (H / G) (GQA). Scores and
softmax are fp32; the value product runs in the inputs' dtype.

`impl` names a preference; each kernel serves the calls it can and the XLA path the rest:
- "cudnn": cuDNN flash attention through `jax.nn.dot_product_attention` (GPU, bf16/fp16),
  for rows holding one segment (`single_segment`: the decoder, the vision windows). The
  valid tokens move to the front of their row and travel as sequence lengths.
- "splash": Pallas splash attention (TPU) with segment ids, lengths padded to 128; off TPU
  it runs in interpret mode (tests only).
- "xla": blockwise attention with an online softmax (flash.py); never builds [T, S] scores,
  visits only the key blocks a query block can see. Up to DENSE_MAX keys it is "dense".
- "dense": the reference: [T, S] fp32 scores, softmax, value product.
- "auto": "cudnn" on GPU, "splash" on TPU, "xla" elsewhere.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from dart_jax.models.flash import flash_attention
from dart_jax.models.sharding import logical_to_spec

IMPLS = ("auto", "xla", "dense", "cudnn", "splash")
DENSE_MAX = 512  # up to this many keys the XLA path materializes the scores (faster there)
# XLA path: query/key block by backend; on 2 CPU cores 256 ran 1.6-2.6x faster than 512 and
# dense (fwd+bwd at 1-2k tokens), and 512 leaves GPU kernels enough work per block
XLA_BLOCK = {"cpu": 256}
SPLASH_BLOCK = 128


def check_impl(impl: str) -> str:
    if impl not in IMPLS:
        raise ValueError(f"unknown attention implementation {impl!r}; choose from {IMPLS}")
    return impl


def resolve(impl: str, *, dtype, kv_len: int, single_segment: bool, backend: str | None = None) -> str:
    """The kernel that runs a call of these static properties."""
    check_impl(impl)
    backend = backend or jax.default_backend()
    if impl == "auto":
        impl = {"gpu": "cudnn", "tpu": "splash"}.get(backend, "xla")
    if impl == "cudnn" and (not single_segment or jnp.dtype(dtype) not in (jnp.bfloat16, jnp.float16)):
        impl = "xla"
    if impl == "splash" and kv_len < SPLASH_BLOCK:
        impl = "xla"
    if impl == "xla" and kv_len <= DENSE_MAX:
        impl = "dense"
    return impl


def attention(q_BxTxHxK, k_BxSxGxK, v_BxSxGxK, seg_q_BxT, seg_kv_BxS, *, causal: bool,
              impl: str = "auto", single_segment: bool = False) -> jax.Array:
    """Softmax attention [B, T, H, K] in q's dtype (see the module docstring)."""
    kind = resolve(impl, dtype=q_BxTxHxK.dtype, kv_len=k_BxSxGxK.shape[1], single_segment=single_segment)
    args = (q_BxTxHxK, k_BxSxGxK, v_BxSxGxK, seg_q_BxT, seg_kv_BxS)
    if kind == "dense":
        return dense_attention(*args, causal=causal)
    if kind == "xla":
        block = XLA_BLOCK.get(jax.default_backend(), 512)
        return flash_attention(*args, causal=causal, block_q=block, block_k=block)
    if kind == "cudnn":
        return cudnn_attention(*args, causal=causal)
    return _per_shard(functools.partial(splash_attention, causal=causal), *args)


def dense_attention(q_BxTxHxK, k_BxSxGxK, v_BxSxGxK, seg_q_BxT, seg_kv_BxS, *, causal: bool) -> jax.Array:
    """Materialized [B, G, R, T, S] fp32 scores; rows that see nothing average all values."""
    b, t, h, d = q_BxTxHxK.shape
    g = k_BxSxGxK.shape[2]
    q_BxTxGxRxK = q_BxTxHxK.reshape(b, t, g, h // g, d)
    scores = jnp.einsum("bqgrk,bsgk->bgrqs", q_BxTxGxRxK, k_BxSxGxK) * (d**-0.5)
    scores = scores.astype(jnp.float32)
    mask = _dense_mask(seg_q_BxT, seg_kv_BxS, causal)
    scores = jnp.where(mask[:, None, None], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(q_BxTxHxK.dtype)
    out = jnp.einsum("bgrqs,bsgk->bqgrk", probs, v_BxSxGxK)
    return out.reshape(b, t, h, d)


def _dense_mask(seg_q_BxT, seg_kv_BxS, causal):
    mask = (seg_q_BxT[:, :, None] == seg_kv_BxS[:, None, :]) & (seg_kv_BxS >= 0)[:, None, :]
    if causal:
        t, s = seg_q_BxT.shape[1], seg_kv_BxS.shape[1]
        mask &= jnp.tril(jnp.ones((t, s), dtype=bool))[None]
    return mask


def cudnn_attention(q_BxTxHxK, k_BxTxGxK, v_BxTxGxK, seg_q_BxT, seg_kv_BxT, *, causal: bool) -> jax.Array:
    """cuDNN flash attention on self-attention rows with one segment: the row's valid tokens
    (order kept) move to its front and their count is its length; the output moves back.
    Rows with no valid token get length 1 (cuDNN needs one) and an unspecified output."""
    if q_BxTxHxK.shape[1] != k_BxTxGxK.shape[1]:
        raise ValueError("cudnn_attention serves self-attention (T == S)")
    order_BxT = jnp.argsort(seg_q_BxT < 0, axis=1, stable=True)
    lengths_B = jnp.maximum(jnp.sum(seg_q_BxT >= 0, axis=1), 1).astype(jnp.int32)
    front = lambda x: jnp.take_along_axis(x, order_BxT[:, :, None, None], axis=1)  # noqa: E731
    out = jax.nn.dot_product_attention(
        front(q_BxTxHxK), front(k_BxTxGxK), front(v_BxTxGxK), is_causal=causal,
        query_seq_lengths=lengths_B, key_value_seq_lengths=lengths_B, implementation="cudnn")
    back_BxT = jnp.argsort(order_BxT, axis=1)
    return jnp.take_along_axis(out, back_BxT[:, :, None, None], axis=1)


def splash_attention(q_BxTxHxK, k_BxSxGxK, v_BxSxGxK, seg_q_BxT, seg_kv_BxS, *, causal: bool) -> jax.Array:
    """Pallas splash attention, one MQA kernel per (row, KV head); lengths padded to 128.
    Padding queries (id < 0) attend padding keys, so no row of the mask is empty."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk  # TPU kernels: on use

    b, t, h, d = q_BxTxHxK.shape
    s, g = k_BxSxGxK.shape[1], k_BxSxGxK.shape[2]
    pad_t, pad_s = -t % SPLASH_BLOCK, -s % SPLASH_BLOCK
    seg_q = jnp.pad(jnp.maximum(seg_q_BxT, -1), ((0, 0), (0, pad_t)), constant_values=-1).astype(jnp.int32)
    seg_kv = jnp.pad(jnp.maximum(seg_kv_BxS, -1), ((0, 0), (0, pad_s)), constant_values=-1).astype(jnp.int32)
    q = jnp.pad(q_BxTxHxK * jnp.asarray(d**-0.5, q_BxTxHxK.dtype), ((0, 0), (0, pad_t), (0, 0), (0, 0)))
    q_BxGxRxTxK = q.reshape(b, t + pad_t, g, h // g, d).transpose(0, 2, 3, 1, 4)
    kv = lambda x: jnp.pad(x, ((0, 0), (0, pad_s), (0, 0), (0, 0))).transpose(0, 2, 1, 3)  # noqa: E731
    kernel = _splash_kernel(t + pad_t, s + pad_s, h // g, causal, jax.default_backend() != "tpu")

    def one(q_RxTxK, k_SxK, v_SxK, sq_T, skv_S):
        return kernel(q_RxTxK, k_SxK, v_SxK, segment_ids=sk.SegmentIds(sq_T, skv_S))

    per_head = jax.vmap(one, in_axes=(0, 0, 0, None, None))
    out = jax.vmap(per_head)(q_BxGxRxTxK, kv(k_BxSxGxK), kv(v_BxSxGxK), seg_q, seg_kv)
    return out.transpose(0, 3, 1, 2, 4).reshape(b, t + pad_t, h, d)[:, :t]


@functools.lru_cache(maxsize=None)
def _splash_kernel(t: int, s: int, heads: int, causal: bool, interpret: bool):
    # TPU kernels, imported on use: hosts that never take this path need not load Pallas' TPU ops
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    one = sm.CausalMask((t, s)) if causal else sm.FullMask((t, s))
    bq, bk = _largest_block(t), _largest_block(s)
    blocks = sk.BlockSizes(block_q=bq, block_kv=bk, block_kv_compute=bk, block_q_dkv=bq,
                           block_kv_dkv=bk, block_kv_dkv_compute=bk, block_q_dq=bq, block_kv_dq=bk)
    return sk.make_splash_mqa_single_device(sm.MultiHeadMask([one] * heads), block_sizes=blocks,
                                            interpret=interpret)


def _largest_block(n: int) -> int:
    return next(b for b in (512, 256, SPLASH_BLOCK) if n % b == 0)


def _per_shard(fn, q_BxTxHxK, k_BxSxGxK, v_BxSxGxK, seg_q_BxT, seg_kv_BxS):
    """Run a Pallas kernel on each device's rows and heads (shard_map over the context mesh),
    as GSPMD cannot partition it. Heads split only as the KV heads do (whole groups)."""
    mesh = jax.sharding.get_abstract_mesh()
    args = (q_BxTxHxK, k_BxSxGxK, v_BxSxGxK, seg_q_BxT, seg_kv_BxS)
    if mesh.empty:
        return fn(*args)
    sizes = dict(mesh.shape)
    rows = logical_to_spec(("batch",), q_BxTxHxK.shape[:1], sizes)[0]
    heads = logical_to_spec(("act_kv_heads",), k_BxSxGxK.shape[2:3], sizes)[0]
    qkv, seg = P(rows, None, heads, None), P(rows, None)
    return jax.shard_map(fn, in_specs=(qkv, qkv, qkv, seg, seg), out_specs=qkv, check_vma=False)(*args)
