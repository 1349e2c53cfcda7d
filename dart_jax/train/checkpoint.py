"""Train-state checkpoints with orbax: the sharded pytree and the run's JSON metadata, together.

Each checkpoint step holds two items of one orbax Composite: `state` (the train state pytree:
params, optimizer state, step, rng key; StandardSave, every host writes its shards) and `meta`
(JsonSave: policy version, the data position, the config hash). Saving is asynchronous: `save`
returns once the arrays are copied off the device, and the files are written in the background
(so the train step may donate the state's buffers right after). The last `max_to_keep` steps
stay.

    ckpt = Checkpointer(run_dir / "checkpoints", max_to_keep=3)
    ckpt.save(step, state, CheckpointMeta(policy_version=v, data_state=it.get_state(),
                                          config_hash=config_hash(cfg)))
    ...
    if (step := ckpt.latest_step()) is not None:             # resume
        target = abstract_state(init_state_shapes, shardings)  # NamedShardings on this mesh
        state, meta = ckpt.restore(target, step, config_hash=config_hash(cfg))
        it.set_state(meta.data_state)                        # grain iterator or DataManagerSource
    ckpt.close()                                             # waits for the last save

Restoring reads straight onto the target's shardings, which may differ from the saving run's
mesh (resharding is orbax's); target leaves that are `ocp.PLACEHOLDER` are not read at all. Typed PRNG keys (`jax.random.key`) are stored as their key data
and rewrapped on restore.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp


@dataclass(frozen=True)
class CheckpointMeta:
    """What a resumed run needs besides the arrays (JSON)."""
    policy_version: int
    data_state: dict[str, Any]  # grain iterator state, or a DataManagerSource cursor
    config_hash: str
    extra: dict[str, Any] = field(default_factory=dict)


def config_hash(cfg: Any) -> str:
    """A stable digest of a (frozen dataclass) config, to refuse resuming under another one."""
    d = dataclasses.asdict(cfg) if dataclasses.is_dataclass(cfg) else cfg
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


def abstract_state(state: Any, shardings: Any) -> Any:
    """ShapeDtypeStructs of `state` (arrays or shapes) placed on `shardings` (same tree)."""
    def spec(x, s):
        return jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=s)
    return jax.tree.map(spec, state, shardings)


def _is_key(x) -> bool:
    return isinstance(x, (jax.Array, jax.ShapeDtypeStruct)) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _unwrap_keys(tree: Any) -> Any:
    return jax.tree.map(lambda x: jax.random.key_data(x) if _is_key(x) else x, tree)


def _wrap_key(data: jax.Array, like) -> jax.Array:
    # A key ShapeDtypeStruct names its PRNG implementation only through its dtype's `_impl`.
    impl = jax.random.key_impl(like) if isinstance(like, jax.Array) else like.dtype._impl
    return jax.random.wrap_key_data(data, impl=impl)


def _abstract_key_data(x: jax.ShapeDtypeStruct) -> jax.ShapeDtypeStruct:
    data = jax.eval_shape(jax.random.key_data, x)
    return jax.ShapeDtypeStruct(data.shape, data.dtype, sharding=_key_data_sharding(x.sharding, data.ndim))


def _key_data_sharding(sharding, ndim: int):
    """A key array's sharding extended over the trailing key-data dimension (replicated)."""
    if isinstance(sharding, jax.sharding.NamedSharding):
        spec = tuple(sharding.spec) + (None,) * (ndim - len(sharding.spec))
        return jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec(*spec))
    return sharding


def _restore_args(abstract: Any):
    """Every array of `abstract`, except the leaves that are ocp.PLACEHOLDER: those are left on
    disk, unread (export restores the parameters without the optimizer state)."""
    if not any(x is ocp.PLACEHOLDER for x in jax.tree.leaves(abstract)):
        return ocp.args.StandardRestore(abstract)
    restore = jax.tree.map(lambda x: x if x is ocp.PLACEHOLDER else ocp.checkpoint_utils.construct_restore_args(x),
                           abstract)
    return ocp.args.PyTreeRestore(abstract, restore_args=restore)


class Checkpointer:
    """An orbax CheckpointManager for (state pytree, CheckpointMeta) pairs."""

    def __init__(self, directory: str | Path, *, max_to_keep: int = 3, save_interval_steps: int = 1,
                 async_save: bool = True):
        options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, save_interval_steps=save_interval_steps,
                                               enable_async_checkpointing=async_save, create=True)
        self.directory = Path(directory).absolute()
        self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=("state", "meta"))

    def save(self, step: int, state: Any, meta: CheckpointMeta, *, force: bool = False) -> bool:
        """Start saving `step` (False when the save interval skips it); returns before the write ends."""
        args = ocp.args.Composite(state=ocp.args.StandardSave(_unwrap_keys(state)),
                                  meta=ocp.args.JsonSave(dataclasses.asdict(meta)))
        return self.manager.save(step, args=args, force=force)

    def restore(self, target: Any, step: int | None = None, *,
                config_hash: str | None = None) -> tuple[Any, CheckpointMeta]:
        """(state on `target`'s shardings, meta) of `step` (default: the latest)."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        self.manager.wait_until_finished()
        abstract = jax.tree.map(lambda x: _abstract_key_data(x) if _is_key(x) else x, target)
        got = self.manager.restore(step, args=ocp.args.Composite(state=_restore_args(abstract),
                                                                 meta=ocp.args.JsonRestore()))
        meta = CheckpointMeta(**got["meta"])
        if config_hash is not None and meta.config_hash != config_hash:
            raise ValueError(f"checkpoint {step} in {self.directory} was saved under config {meta.config_hash}, "
                             f"this run's is {config_hash}")
        state = jax.tree.map(lambda t, x: _wrap_key(x, t) if _is_key(t) else x, target, got["state"])
        return state, meta

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def all_steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def wait(self) -> None:
        """Block until the pending asynchronous save is on disk."""
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.close()

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
