"""Qwen2 decoder with multimodal rotary (mrope); attribute names follow transformers' Qwen2_5_VLTextModel."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from flax import nnx

from dart_jax.models.attention import attention
from dart_jax.models.config import TextConfig
from dart_jax.models.layer_scan import check_remat, scan, stacked
from dart_jax.models.layers import Linear, RMSNorm, SwiGLU, apply_rotary, param
from dart_jax.models.sharding import constrain

_ACT = ("batch", "length", "act_embed")


class Embed(nnx.Module):
    def __init__(self, vocab: int, dim: int, *, dtype, rngs: nnx.Rngs):
        self.embedding = param(rngs, (vocab, dim), ("vocab", "embed"))
        self.dtype = dtype

    def __call__(self, ids_BxT):
        return jnp.take(self.embedding[...], ids_BxT, axis=0).astype(self.dtype)


class Attention(nnx.Module):
    def __init__(self, cfg: TextConfig, *, dtype, rngs: nnx.Rngs):
        d, hd = cfg.hidden_size, cfg.head_dim
        self.q_proj = Linear(d, cfg.num_attention_heads * hd, axes=("embed", "q_heads"), bias=True, dtype=dtype, rngs=rngs)
        self.k_proj = Linear(d, cfg.num_key_value_heads * hd, axes=("embed", "kv_heads"), bias=True, dtype=dtype, rngs=rngs)
        self.v_proj = Linear(d, cfg.num_key_value_heads * hd, axes=("embed", "kv_heads"), bias=True, dtype=dtype, rngs=rngs)
        self.o_proj = Linear(cfg.num_attention_heads * hd, d, axes=("q_heads", "embed"), bias=False, dtype=dtype, rngs=rngs)
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, hd
        self.dtype = dtype

    def __call__(self, x_BxTxD, cos_BxTxK, sin_BxTxK, seg_BxT, impl: str, packed: bool):
        b, t, _ = x_BxTxD.shape
        q = self.q_proj(x_BxTxD).reshape(b, t, self.heads, self.head_dim)
        k = self.k_proj(x_BxTxD).reshape(b, t, self.kv_heads, self.head_dim)
        v = self.v_proj(x_BxTxD).reshape(b, t, self.kv_heads, self.head_dim)
        q = constrain(apply_rotary(q, cos_BxTxK, sin_BxTxK), ("batch", "length", "act_heads", "head_dim"))
        k = constrain(apply_rotary(k, cos_BxTxK, sin_BxTxK), ("batch", "length", "act_kv_heads", "head_dim"))
        out = attention(q, k, v, seg_BxT, seg_BxT, causal=True, impl=impl, single_segment=not packed)
        return self.o_proj(out.reshape(b, t, -1))


class DecoderLayer(nnx.Module):
    def __init__(self, cfg: TextConfig, *, dtype, rngs: nnx.Rngs):
        self.self_attn = Attention(cfg, dtype=dtype, rngs=rngs)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size, bias=False, axes=("embed", "mlp"), dtype=dtype, rngs=rngs)
        self.input_layernorm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps, dtype=dtype, rngs=rngs)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps, dtype=dtype, rngs=rngs)

    def __call__(self, x, cos, sin, seg, impl: str, packed: bool):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, seg, impl, packed)
        x = x + self.mlp(self.post_attention_layernorm(x))
        return constrain(x, _ACT)


class TextModel(nnx.Module):
    def __init__(self, cfg: TextConfig, *, dtype, rngs: nnx.Rngs):
        self.embed_tokens = Embed(cfg.vocab_size, cfg.hidden_size, dtype=dtype, rngs=rngs)
        self.layers = stacked(lambda r: DecoderLayer(cfg, dtype=dtype, rngs=r), cfg.num_hidden_layers, rngs)
        self.norm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps, dtype=dtype, rngs=rngs)
        # mrope: frequency j rotates with the position of axis section_axis[j] (t, h, w, t, h, w...)
        self.section_axis = tuple(int(a) for a in np.repeat(np.arange(len(cfg.mrope_section)) % 3, cfg.mrope_section))
        self.head_dim = cfg.head_dim
        self.rope_theta = cfg.rope_theta
        self.dtype = dtype

    def rotary(self, pos_3xBxT):
        dim = self.head_dim
        inv_freq = 1.0 / (self.rope_theta ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))
        pos_BxTxF = jnp.moveaxis(pos_3xBxT[np.array(self.section_axis)], 0, -1).astype(jnp.float32)
        freqs = pos_BxTxF * inv_freq
        emb = jnp.concatenate([freqs, freqs], axis=-1)
        return jnp.cos(emb).astype(self.dtype), jnp.sin(emb).astype(self.dtype)

    def __call__(self, embeds_BxTxD, attention_mask_BxT, pos_3xBxT, *, remat: str, impl: str,
                 packed: bool = False):
        """Final-norm hidden states [B, T, D] for causal attention within each sequence: the
        mask numbers a packed row's sequences (1, 2, ...; `packed`), 0 is padding."""
        seg_BxT = attention_mask_BxT - 1  # -1: padding
        cos, sin = self.rotary(pos_3xBxT)
        x = constrain(embeds_BxTxD, _ACT)
        x = scan(self.layers, x, lambda layer, x, _: layer(x, cos, sin, seg_BxT, impl, packed), check_remat(remat))
        return self.norm(x)
