"""The trainer's sizes on one chip: parameters under the sharding table, a micro-batch's rows,
one screenshot's geometry, and the layer stacks the activation formulas (capacity/memory.py) take.

Everything comes from the model's own abstract parameters (shapes and logical axes, no memory),
the one sharding table (models/sharding.py) and the trainer's collator, so a change to any of
them changes the plan with it.
"""

from __future__ import annotations

import dataclasses
import functools
import math

from flax import nnx

from dart_jax.agent.image_processing import ImageProcessorConfig
from dart_jax.capacity.memory import Stack
from dart_jax.models.qwen25vl import abstract_model
from dart_jax.models.sharding import logical_to_spec
from dart_jax.train.batch import BucketSpec
from dart_jax.train.collate import Collator


@dataclasses.dataclass(frozen=True)
class Params:
    """Parameter counts of the model on a mesh (each parameter sharded as the table says)."""
    total: int
    chip: float  # on one chip
    layer: float  # the largest decoder layer or vision block, split by tp only
    head: float  # the LM head kernel, split by tp only


@dataclasses.dataclass(frozen=True)
class Batch:
    rows: int  # global rows of one micro-batch: rows per host x hosts
    rows_chip: float  # of them on one chip
    seq_len: int
    slots: int


def factor(names, shape, mesh: dict[str, int]) -> int:
    """How many ways the sharding table splits an array of `shape` whose axes are `names`."""
    spec = logical_to_spec(names, shape, mesh)
    return math.prod(mesh[a] for s in spec if s for a in ((s,) if isinstance(s, str) else s))


@functools.lru_cache(maxsize=4)
def _abstract_params(model) -> tuple[tuple[tuple, tuple[int, ...], tuple], ...]:
    """(path, shape, logical axes) of every parameter; building a 7B model's shapes takes seconds."""
    out = []
    for path, var in nnx.to_flat_state(abstract_model(model)[1]):
        shape = tuple(var.get_value().shape)
        out.append((tuple(path), shape, var.get_metadata().get("logical_axes") or (None,) * len(shape)))
    return tuple(out)


def param_counts(model, mesh: dict[str, int]) -> Params:
    """From the model's abstract parameters (no memory) and their logical axes."""
    tp_only = {"tp": mesh["tp"]}
    total = chip_share = head = 0.0
    per_layer = {("model", "layers"): 0.0, ("visual", "blocks"): 0.0}
    for path, shape, names in _abstract_params(model):
        n = math.prod(shape)
        total += n
        chip_share += n / factor(names, shape, mesh)
        if path[:2] in per_layer:
            per_layer[path[:2]] += n / factor(names, shape, tp_only)
        if path == ("lm_head", "kernel") or (model.tie_word_embeddings and path[-1] == "embedding"):
            head = n / factor(names, shape, tp_only)
    layer = max(per_layer[("model", "layers")] / model.text.num_hidden_layers,
                per_layer[("visual", "blocks")] / model.vision.depth)
    return Params(int(total), chip_share, layer, head)


def batch_of(trainer, hosts: int, mesh: dict[str, int]) -> Batch:
    b = trainer.buckets
    rows = b.rows * hosts
    return Batch(rows, rows / factor(("batch",), (rows,), mesh), b.seq_lens[-1], b.num_slots[-1])


@dataclasses.dataclass(frozen=True)
class Screens:
    """One screenshot's geometry: resized size, patches, merged tokens, vision slots."""
    count: int
    resized: tuple[int, int]  # (height, width) after smart_resize
    patches: int
    tokens: int
    slots: int  # in the window layout (every window padded to full size)


def screens_of(model, plan, trainer) -> Screens:
    """`plan.screenshots` screens of `plan.screen_width` x `screen_height` as the trainer lays them out."""
    v = model.vision
    image = ImageProcessorConfig(plan.min_pixels, plan.max_pixels, patch_size=v.patch_size,
                                 temporal_patch_size=v.temporal_patch_size, merge_size=v.spatial_merge_size)
    b = trainer.buckets
    collator = Collator(model, image, BucketSpec(b.seq_lens, b.num_slots, b.rows, b.pack))
    grid = image.grid_thw(plan.screen_height, plan.screen_width)
    return Screens(plan.screenshots, image.resized_hw(plan.screen_height, plan.screen_width),
                   grid[1] * grid[2], image.num_image_tokens(plan.screen_height, plan.screen_width),
                   collator.grid_slots(*grid))


def text_stack(t, mesh: dict[str, int]) -> Stack:
    hd = t.head_dim
    return Stack(t.num_hidden_layers, t.hidden_size,
                 t.num_attention_heads * hd / factor(("act_heads",), (t.num_attention_heads,), mesh),
                 t.num_key_value_heads * hd / factor(("act_kv_heads",), (t.num_key_value_heads,), mesh),
                 t.intermediate_size / factor(("act_mlp",), (t.intermediate_size,), mesh))


def vision_stack(v, mesh: dict[str, int]) -> Stack:
    q = v.hidden_size / factor(("act_heads",), (v.num_heads,), mesh)
    return Stack(v.depth, v.hidden_size, q, q, v.intermediate_size / factor(("act_mlp",), (v.intermediate_size,), mesh))
