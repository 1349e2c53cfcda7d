"""Qwen2.5-VL (UI-TARS-1.5, DART-GUI) in Flax NNX, and the plain functions a trainer jits.

Attribute paths mirror the original Hugging Face names (`model.layers.3.self_attn.q_proj`,
`visual.blocks.0.attn.qkv`, `visual.merger.mlp_0` for `mlp.0`, `lm_head`), so convert.py is
mechanical. Parameters are fp32; `dtype` is the compute dtype (bf16 on TPU); logits are fp32.

Trainer use: split once, jit plain functions of (params, inputs); never materialize [T, V] logits.

    model = create_model(config, dtype="bfloat16", remat="dots")     # or hf_io.load_model(...)
    graphdef, params = nnx.split(model)

    @jax.jit
    def token_logprobs(params, inputs: ModelInputs, targets_BxT):
        h_BxTxD = hidden_states((graphdef, params), inputs)           # after the final norm
        w_DxV = lm_head_kernel((graphdef, params))                   # tied: embedding transposed
        ...  # chunk over T: logits_chunk = h_chunk @ w_DxV in fp32, log_softmax, gather targets

`remat` names the checkpoint policy of the scanned decoder layers (`vision_remat`, of the
vision blocks; layer_scan.py) and `attention` the attention kernel preference (attention.py); both
are static options of the graph, replaceable on a split model with `with_options`.

`inputs` comes from `inputs.make_inputs(config, input_ids, attention_mask, pixel_values,
image_grid_thw, seq_len=..., num_slots=...)` (numpy, host side). Under a mesh, run inside
`jax.set_mesh(mesh)` so activations are constrained by the logical rules of sharding.py.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from dart_jax.models.attention import check_impl
from dart_jax.models.config import Qwen25VLConfig
from dart_jax.models.inputs import ModelInputs
from dart_jax.models.layer_scan import check_remat
from dart_jax.models.layers import Linear
from dart_jax.models.text import TextModel
from dart_jax.models.vision import VisionTransformer


@dataclasses.dataclass(frozen=True)
class ModelOptions:
    """How the graph runs (not what it computes): remat policies and the attention kernel."""
    remat: str = "none"
    vision_remat: str | None = None  # None: as `remat`
    attention: str = "auto"

    def __post_init__(self):
        check_remat(self.remat)
        check_remat(self.vision_remat or self.remat)
        check_impl(self.attention)


class Qwen25VL(nnx.Module):
    def __init__(self, config: Qwen25VLConfig, *, dtype="float32", options: ModelOptions = ModelOptions(),
                 rngs: nnx.Rngs):
        dtype = jnp.dtype(dtype)
        self.config = config
        self.options = options
        self.model = TextModel(config.text, dtype=dtype, rngs=rngs)
        self.visual = VisionTransformer(config.vision, dtype=dtype, rngs=rngs)
        self.lm_head = (
            None
            if config.tie_word_embeddings
            else Linear(config.text.hidden_size, config.text.vocab_size, axes=("embed", "vocab"), bias=False, dtype=dtype, rngs=rngs)
        )
        self.dtype = dtype

    def embed(self, inputs: ModelInputs):
        embeds = self.model.embed_tokens(inputs.input_ids)
        if not inputs.has_vision:
            return embeds
        opts = self.options
        feats_BxMxD = self.visual(inputs.pixel_values, inputs.vision_position_ids, inputs.vision_segment_ids,
                                  remat=opts.vision_remat or opts.remat, impl=opts.attention)
        idx_BxT = inputs.image_token_index
        picked = jnp.take_along_axis(feats_BxMxD, jnp.maximum(idx_BxT, 0)[..., None], axis=1)
        return jnp.where((idx_BxT >= 0)[..., None], picked.astype(self.dtype), embeds)

    def hidden_states(self, inputs: ModelInputs):
        return self.model(self.embed(inputs), inputs.attention_mask, inputs.position_ids,
                          remat=self.options.remat, impl=self.options.attention, packed=inputs.packed)

    def lm_head_kernel(self):
        if self.lm_head is None:
            return self.model.embed_tokens.embedding[...].T
        return self.lm_head.kernel[...]

    def __call__(self, inputs: ModelInputs):
        h = self.hidden_states(inputs)
        return jnp.dot(h, self.lm_head_kernel().astype(self.dtype), preferred_element_type=jnp.float32)


def _as_module(model) -> Qwen25VL:
    if isinstance(model, nnx.Module):
        return model
    graphdef, *states = model
    return nnx.merge(graphdef, *states)


def hidden_states(model, inputs: ModelInputs) -> jax.Array:
    """Final-norm hidden states [B, T, D] in the compute dtype; `model` is a module or (graphdef, state...)."""
    return _as_module(model).hidden_states(inputs)


def lm_head_kernel(model) -> jax.Array:
    """LM head kernel [D, V] (fp32 parameters; the embedding transposed when tied)."""
    return _as_module(model).lm_head_kernel()


def logits(model, inputs: ModelInputs) -> jax.Array:
    """fp32 logits [B, T, V]; for checks and small vocabularies only."""
    return _as_module(model)(inputs)


def with_options(graphdef, state, **options) -> nnx.GraphDef:
    """The graphdef of the same model and parameters run with other `ModelOptions` fields."""
    model = nnx.merge(graphdef, state)
    model.options = dataclasses.replace(model.options, **options)
    return nnx.split(model)[0]


def create_model(config: Qwen25VLConfig, *, dtype="float32", remat="none", vision_remat=None, attention="auto",
                 seed: int = 0) -> Qwen25VL:
    """A randomly initialized model (normal(0.02) kernels, zero biases, unit norms)."""
    options = ModelOptions(remat, vision_remat, attention)
    return Qwen25VL(config, dtype=dtype, options=options, rngs=nnx.Rngs(seed))


def abstract_model(config: Qwen25VLConfig, **kwargs):
    """(graphdef, abstract state): shapes, dtypes and logical axes, no parameter memory."""
    return nnx.split(nnx.eval_shape(lambda: create_model(config, **kwargs)))
