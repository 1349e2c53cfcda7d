"""Qwen2.5-VL vision tower in the padded window layout (see inputs.py).

The host lays each row's patches out in `S` slots: every attention window occupies exactly
`window_patches` consecutive slots (shorter edge windows are padded), so window attention is
attention over S/W rows of W slots, and full attention is attention over the S slots with each
image (frame) as its own segment: a patch sees only its own image, at a cost linear in the
number of images (attention.py). Merge units (spatial_merge_size^2 patches) stay contiguous,
so the merger reads groups of consecutive slots. The blocks are stacked and scanned
(layer_scan.py); a per-block flag picks window or full attention. Attribute names follow
transformers' Qwen2_5_VisionTransformerPretrainedModel.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from dart_jax.models.attention import attention
from dart_jax.models.config import VisionConfig
from dart_jax.models.layer_scan import check_remat, scan, stacked
from dart_jax.models.layers import Linear, RMSNorm, SwiGLU, apply_rotary
from dart_jax.models.sharding import constrain

_ACT = ("batch", "slots", "act_embed")


class VisionPatchEmbed(nnx.Module):
    """Conv3d with kernel == stride over (C, t, p, p) patches, as one matmul on flattened patches."""

    def __init__(self, cfg: VisionConfig, *, dtype, rngs: nnx.Rngs):
        self.proj = Linear(cfg.patch_dim, cfg.hidden_size, axes=("patch", "vision_embed"), bias=False, dtype=dtype, rngs=rngs)

    def __call__(self, patches_BxSxP):
        return self.proj(patches_BxSxP)


class VisionAttention(nnx.Module):
    def __init__(self, cfg: VisionConfig, *, dtype, rngs: nnx.Rngs):
        d = cfg.hidden_size
        self.qkv = Linear(d, 3 * d, axes=("vision_embed", "vision_qkv"), bias=True, dtype=dtype, rngs=rngs)
        self.proj = Linear(d, d, axes=("vision_heads", "vision_embed"), bias=True, dtype=dtype, rngs=rngs)
        self.num_heads = cfg.num_heads
        self.window = cfg.window_patches
        self.dtype = dtype

    def __call__(self, x_BxSxD, cos_BxSxK, sin_BxSxK, seg_BxS, full, impl: str):
        b, s, d = x_BxSxD.shape
        h, w = self.num_heads, self.window
        qkv = self.qkv(x_BxSxD).reshape(b, s, 3, h, d // h)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        # transformers rotates vision q/k in fp32 whatever the compute dtype
        q = apply_rotary(q.astype(jnp.float32), cos_BxSxK, sin_BxSxK).astype(self.dtype)
        k = apply_rotary(k.astype(jnp.float32), cos_BxSxK, sin_BxSxK).astype(self.dtype)

        def whole(q, k, v):  # each image attends to itself
            return attention(q, k, v, seg_BxS, seg_BxS, causal=False, impl=impl)

        def windows(q, k, v):  # each window of W slots attends to itself
            seg_NxW = seg_BxS.reshape(b * s // w, w)
            q, k, v = (t.reshape(b * s // w, w, h, d // h) for t in (q, k, v))
            out = attention(q, k, v, seg_NxW, seg_NxW, causal=False, impl=impl, single_segment=True)
            return out.reshape(b, s, h, d // h)

        out = jax.lax.cond(full, whole, windows, q, k, v)
        return self.proj(out.reshape(b, s, d))


class VisionBlock(nnx.Module):
    def __init__(self, cfg: VisionConfig, *, dtype, rngs: nnx.Rngs):
        self.norm1 = RMSNorm(cfg.hidden_size, eps=1e-6, dtype=dtype, rngs=rngs)
        self.norm2 = RMSNorm(cfg.hidden_size, eps=1e-6, dtype=dtype, rngs=rngs)
        self.attn = VisionAttention(cfg, dtype=dtype, rngs=rngs)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size, bias=True, axes=("vision_embed", "vision_mlp"), dtype=dtype, rngs=rngs)

    def __call__(self, x, cos, sin, seg, full, impl: str):
        x = x + self.attn(self.norm1(x), cos, sin, seg, full, impl)
        x = x + self.mlp(self.norm2(x))
        return constrain(x, _ACT)


class PatchMerger(nnx.Module):
    """RMSNorm, then each merge unit's patches concatenated -> Linear -> GELU -> Linear (mlp.0, mlp.2)."""

    def __init__(self, cfg: VisionConfig, *, dtype, rngs: nnx.Rngs):
        hidden = cfg.hidden_size * cfg.merge_unit
        self.ln_q = RMSNorm(cfg.hidden_size, eps=1e-6, dtype=dtype, rngs=rngs)
        self.mlp_0 = Linear(hidden, hidden, axes=("merger_in", "vision_mlp"), bias=True, dtype=dtype, rngs=rngs)
        self.mlp_2 = Linear(hidden, cfg.out_hidden_size, axes=("vision_mlp", "embed"), bias=True, dtype=dtype, rngs=rngs)
        self.hidden = hidden

    def __call__(self, x_BxSxD):
        b, s, _ = x_BxSxD.shape
        x = self.ln_q(x_BxSxD).reshape(b, s * x_BxSxD.shape[-1] // self.hidden, self.hidden)
        return self.mlp_2(jax.nn.gelu(self.mlp_0(x), approximate=False))


class VisionTransformer(nnx.Module):
    def __init__(self, cfg: VisionConfig, *, dtype, rngs: nnx.Rngs):
        self.patch_embed = VisionPatchEmbed(cfg, dtype=dtype, rngs=rngs)
        self.blocks = stacked(lambda r: VisionBlock(cfg, dtype=dtype, rngs=r), cfg.depth, rngs)
        self.merger = PatchMerger(cfg, dtype=dtype, rngs=rngs)
        self.full_attention = tuple(i in cfg.fullatt_block_indexes for i in range(cfg.depth))
        self.head_dim = cfg.head_dim
        self.rope_theta = cfg.rope_theta

    def rotary(self, pos_BxSx2):
        """Axial 2D rotary: (h, w) frequencies of head_dim/4 each, concatenated, then duplicated."""
        dim = self.head_dim // 2
        inv_freq = 1.0 / (self.rope_theta ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))
        freqs = pos_BxSx2.astype(jnp.float32)[..., None] * inv_freq  # [B, S, 2, dim/2]
        freqs = freqs.reshape(*freqs.shape[:2], dim)
        emb = jnp.concatenate([freqs, freqs], axis=-1)
        return jnp.cos(emb), jnp.sin(emb)

    def __call__(self, patches_BxSxP, pos_BxSx2, seg_BxS, *, remat: str, impl: str):
        """Merged visual tokens [B, S / merge_unit, out_hidden_size] in slot order."""
        x = constrain(self.patch_embed(patches_BxSxP), _ACT)
        cos, sin = self.rotary(pos_BxSx2)
        full_L = jnp.asarray(self.full_attention)
        x = scan(self.blocks, x, lambda blk, x, full: blk(x, cos, sin, seg_BxS, full, impl), check_remat(remat), full_L)
        return self.merger(x)
