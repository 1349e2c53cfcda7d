"""The one mapping between Flax parameters and Hugging Face tensors (names and torch layout).

Names are those of the original Qwen2.5-VL / UI-TARS checkpoints on the Hub, which vLLM and
transformers both load: `model.embed_tokens.weight`, `model.layers.N...`, `model.norm.weight`,
`visual.blocks.N...`, `visual.merger.mlp.0...`, `lm_head.weight` (`wire.weights.canonical_hf_name`
maps the transformers-5 `save_pretrained` names, `model.language_model.*` and `model.visual.*`, to them).

Layouts: a Flax kernel is [in, out], torch Linear.weight [out, in]; the patch embedding is a
Linear kernel [C*t*p*p, D] here and a Conv3d weight [D, C, t, p, p] in torch. Decoder layers
and vision blocks are stacked here (one array per parameter with a leading layer axis, see
layer_scan.py) and one tensor per layer there: a stacked parameter has one spec per layer
(`ParamSpec.layer`), and specs run layer by layer as the checkpoints list them.

    for bucket in hf_buckets(state, config, bucket_bytes=256 << 20):   # export and weight sync
        for hf_name, array in bucket: ...
"""

from __future__ import annotations

from collections.abc import Iterator
import dataclasses
import functools
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from dart_jax.models.config import Qwen25VLConfig

Path = tuple
STACKS = (("model", "layers"), ("visual", "blocks"))  # state paths of the stacked layers


@dataclass(frozen=True)
class ParamSpec:
    hf_name: str
    path: Path  # nnx state path
    shape: tuple[int, ...]  # Flax shape
    hf_shape: tuple[int, ...]  # torch shape
    kind: str  # "copy" | "linear" | "conv3d"
    layer: int | None = None  # index along the leading layer axis of a stacked parameter

    def from_hf(self, x: np.ndarray) -> np.ndarray:
        """Flax layout of a torch-layout tensor, or of a block of it cut along dim 0 (conv3d)."""
        if self.kind == "copy":
            return x
        return np.ascontiguousarray(x.reshape(x.shape[0], -1).T)

    def hf_index(self, index: tuple[slice, ...]) -> tuple[slice, ...]:
        """The torch-layout block holding the Flax-layout block `index` (whole trailing dims for conv3d)."""
        if self.kind == "copy":
            return index
        if self.kind == "linear":
            return (index[1], index[0])
        return (index[1],) + (slice(None),) * (len(self.hf_shape) - 1)


def hf_name_of(path: Path, layer: int | None = None) -> str:
    parts = [str(p) for p in (path if layer is None else path[:2] + (layer,) + path[2:])]
    if parts[-1] in ("kernel", "embedding"):
        parts[-1] = "weight"
    return ".".join(parts).replace(".mlp_0.", ".mlp.0.").replace(".mlp_2.", ".mlp.2.")


def param_specs(abstract_state) -> list[ParamSpec]:
    """One spec per HF tensor of an (abstract) nnx State: state order, stacks layer by layer."""
    specs, rank = [], {}
    for path, var in nnx.to_flat_state(abstract_state):
        path, shape = tuple(path), tuple(var.get_value().shape)
        stacked = path[:2] in STACKS
        rank.setdefault(path[:2] if stacked else path, len(rank))
        for layer in range(shape[0]) if stacked else (None,):
            specs.append(_spec(path, shape[1:] if stacked else shape, layer))
    group = lambda s: rank[s.path[:2] if s.layer is not None else s.path]  # noqa: E731
    return sorted(specs, key=lambda s: (group(s), s.layer or 0))


def _spec(path: Path, shape: tuple[int, ...], layer: int | None) -> ParamSpec:
    if path == ("visual", "patch_embed", "proj", "kernel"):
        kind, hf_shape = "conv3d", None
    elif path[-1] == "kernel":
        kind, hf_shape = "linear", shape[::-1]
    else:
        kind, hf_shape = "copy", shape
    return ParamSpec(hf_name_of(path, layer), path, shape, hf_shape, kind, layer)


def with_conv_shape(specs: list[ParamSpec], config: Qwen25VLConfig) -> list[ParamSpec]:
    v = config.vision
    conv = (v.hidden_size, v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size)
    return [dataclasses.replace(s, hf_shape=conv) if s.kind == "conv3d" else s for s in specs]


def specs_for(abstract_state, config: Qwen25VLConfig) -> list[ParamSpec]:
    return with_conv_shape(param_specs(abstract_state), config)


# ---- the conversion, on the devices that hold the parameters -----------------------------

def to_hf_device(state, config: Qwen25VLConfig, dtype=None,
                 reuse: dict[Path, jax.Array] | None = None) -> Iterator[tuple[Path, jax.Array]]:
    """(state path, the parameter in HF layout and `dtype` (None: its own)) for every
    parameter, still on the devices: [L, *hf_shape] for a stacked one (layer l is tensor
    `specs[l]`), [*hf_shape] otherwise, in the order checkpoint order first needs them.
    Each device converts its own shard inside jit (a transpose and a cast; the output
    sharding is the input's with its axes permuted, so nothing crosses between devices or
    hosts) before anything reaches a host. `reuse` (path -> an earlier result, donated)
    gives the outputs their buffers: memory already touched instead of fresh pages. One
    call per parameter, all layers at once (per layer, XLA's CPU backend transposes 4x
    slower), dispatched as the iterator reaches it."""
    flat = dict(nnx.to_flat_state(state))
    for path, spec in _first_specs(state, config).items():
        x = flat[path].get_value()
        target = np.dtype(x.dtype if dtype is None else dtype).name
        prev = None if reuse is None else reuse.pop(path, None)
        donate = prev is not None and prev.dtype.name == target
        fn = _converter(spec.kind, spec.hf_shape, target, _hf_sharding(x, spec), donate)
        yield path, fn(x, prev) if donate else fn(x)


def hf_device_shapes(state, config: Qwen25VLConfig, dtype=None) -> dict[Path, jax.ShapeDtypeStruct]:
    """What `to_hf_device` will return (shape, dtype and sharding per parameter), without
    converting anything: enough to lay a version out before it exists."""
    flat = dict(nnx.to_flat_state(state))
    out = {}
    for path, spec in _first_specs(state, config).items():
        x = flat[path].get_value()
        stack = x.shape[:1] if spec.layer is not None else ()
        out[path] = jax.ShapeDtypeStruct(stack + spec.hf_shape, np.dtype(x.dtype if dtype is None else dtype),
                                         sharding=_hf_sharding(x, spec))
    return out


def _first_specs(state, config: Qwen25VLConfig) -> dict[Path, ParamSpec]:
    """Each parameter's first spec, in the order checkpoint order first reaches them."""
    first: dict[Path, ParamSpec] = {}
    for spec in specs_for(state, config):
        first.setdefault(spec.path, spec)
    return first


def _hf_sharding(x: jax.Array, spec: ParamSpec):
    """The output sharding that keeps every element on the device that holds it."""
    sharding = x.sharding
    if not isinstance(sharding, NamedSharding):
        return sharding
    axes = tuple(sharding.spec) + (None,) * (x.ndim - len(sharding.spec))
    stack, axes = (axes[:1], axes[1:]) if spec.layer is not None else ((), axes)
    if spec.kind == "linear":
        axes = axes[::-1]
    elif spec.kind == "conv3d":  # [C*t*p*p, D] -> [D, C, t, p, p]; the patch axis is never sharded
        axes = (axes[1],) + (None,) * (len(spec.hf_shape) - 1)
    return NamedSharding(sharding.mesh, PartitionSpec(*stack, *axes))


@functools.lru_cache(maxsize=None)
def _converter(kind: str, hf_shape: tuple[int, ...], dtype: str, out_sharding, donate: bool):
    """One compiled conversion per parameter shape (stacked or not)."""
    def convert(x):
        if kind == "linear":
            x = jnp.swapaxes(x, -1, -2)
        elif kind == "conv3d":  # never stacked
            x = x.T.reshape(hf_shape)
        return x.astype(dtype)

    if not donate:
        return jax.jit(convert, out_shardings=out_sharding)
    # written over the donated array, so XLA aliases the output to its buffer
    return jax.jit(lambda x, prev: jax.lax.dynamic_update_slice(prev, convert(x), (0,) * prev.ndim),
                   out_shardings=out_sharding, donate_argnums=1)


def _host_array(x) -> np.ndarray:
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        from jax.experimental import multihost_utils

        x = multihost_utils.process_allgather(x, tiled=True)
    return np.asarray(jax.device_get(x))


def hf_tensors(state, config: Qwen25VLConfig, dtype=None) -> Iterator[tuple[str, np.ndarray]]:
    """(hf_name, torch-layout array) for every parameter, whole, in checkpoint order, one
    tensor on the host at a time: the device conversion, then each tensor gathered (a
    collective on a multi-host mesh: every process walks this; the export, once per run)."""
    specs = specs_for(state, config)
    last = {spec.path: spec.hf_name for spec in specs}
    converted, done = to_hf_device(state, config, dtype), {}
    for spec in specs:  # layer by layer: a stacked parameter stays converted until its last layer
        while spec.path not in done:
            path, x = next(converted)
            done[path] = x
        x = done[spec.path] if last[spec.path] != spec.hf_name else done.pop(spec.path)
        yield spec.hf_name, _host_array(x if spec.layer is None else x[spec.layer])


def hf_buckets(state, config: Qwen25VLConfig, bucket_bytes: int = 256 << 20, dtype=None) -> Iterator[list[tuple[str, np.ndarray]]]:
    """`hf_tensors` grouped into buckets of at most `bucket_bytes` (a larger tensor travels alone)."""
    bucket, size = [], 0
    for name, x in hf_tensors(state, config, dtype):
        if bucket and size + x.nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, x))
        size += x.nbytes
    if bucket:
        yield bucket
