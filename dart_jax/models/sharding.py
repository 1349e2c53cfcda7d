"""Sharding as data: one table from logical axis names to mesh axes ('data', 'fsdp', 'tp').

Model code names only logical axes: every parameter carries `logical_axes` metadata (one name per
dimension), and activations go through `constrain(x, names)`. `LOGICAL_AXIS_RULES` maps each name
to mesh axes; a mesh axis that does not divide a dimension is dropped for that array (replicated
along it) so tiny test configs run on any mesh.

    mesh = make_mesh(data=1, fsdp=2, tp=4)
    shardings = param_shardings(abstract_state, mesh)        # NamedSharding per parameter
    with jax.set_mesh(mesh):                                 # activations constrained under jit
        out = jax.jit(f)(params, inputs)
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tp")

# logical name -> mesh axes (None: replicated). Parameters first, then activations.
LOGICAL_AXIS_RULES: dict[str, str | tuple[str, ...] | None] = {
    # parameters
    "vocab": "tp",
    "embed": "fsdp",
    "q_heads": "tp",  # flattened heads*head_dim
    "kv_heads": "tp",
    "mlp": "tp",
    "vision_embed": "fsdp",
    "vision_qkv": "tp",
    "vision_heads": "tp",  # flattened heads*head_dim
    "vision_mlp": "tp",
    "patch": None,
    "merger_in": "fsdp",
    "norm": None,
    "layers": None,  # the leading axis of stacked layers: each device holds every layer
    # activations
    "batch": ("data", "fsdp"),
    "length": None,
    "act_embed": None,
    "act_heads": "tp",
    "act_kv_heads": "tp",
    "act_mlp": "tp",
    "act_vocab": "tp",
    "head_dim": None,
    "slots": None,
}


def make_mesh(data: int = 1, fsdp: int = 1, tp: int = 1, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A (data, fsdp, tp) mesh with compiler-chosen (Auto) axis types."""
    devices = list(devices if devices is not None else jax.devices())
    n = data * fsdp * tp
    if n > len(devices):
        raise ValueError(f"mesh {data}x{fsdp}x{tp} needs {n} devices, have {len(devices)}")
    grid = np.array(devices[:n]).reshape(data, fsdp, tp)
    return Mesh(grid, MESH_AXES, axis_types=(AxisType.Auto,) * 3)


def logical_to_spec(names: Sequence[str | None], shape: Sequence[int], mesh_shape: dict[str, int]) -> PartitionSpec:
    """PartitionSpec for an array of `shape` whose dimensions carry logical `names`."""
    if len(names) != len(shape):
        raise ValueError(f"logical axes {tuple(names)} do not match shape {tuple(shape)}")
    used: set[str] = set()
    spec = []
    for name, dim in zip(names, shape):
        if name is not None and name not in LOGICAL_AXIS_RULES:
            raise KeyError(f"logical axis {name!r} has no rule in LOGICAL_AXIS_RULES")
        rule = LOGICAL_AXIS_RULES.get(name) if name else None
        axes = (rule,) if isinstance(rule, str) else tuple(rule or ())
        kept = []
        size = 1
        for ax in axes:
            n = mesh_shape.get(ax, 1)
            if n == 1 or ax in used or dim % (size * n):
                continue
            kept.append(ax)
            size *= n
        used.update(kept)
        spec.append(None if not kept else kept[0] if len(kept) == 1 else tuple(kept))
    return PartitionSpec(*spec)


def param_shardings(state, mesh: Mesh):
    """NamedSharding tree matching an nnx State (or abstract State) whose Params have `logical_axes`."""
    return jax.tree.map(lambda v: var_sharding(v, mesh), state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def var_sharding(var, mesh: Mesh) -> NamedSharding:
    """NamedSharding of one nnx Variable from its `logical_axes` metadata (replicated without)."""
    shape = var.get_value().shape
    names = var.get_metadata().get("logical_axes") or (None,) * len(shape)
    return NamedSharding(mesh, logical_to_spec(names, shape, dict(mesh.shape)))


def constrain(x: jax.Array, names: Sequence[str | None]) -> jax.Array:
    """with_sharding_constraint by logical names under the context mesh (`jax.set_mesh`); no-op without one."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return x
    spec = logical_to_spec(names, x.shape, dict(mesh.shape))
    return jax.lax.with_sharding_constraint(x, spec)
