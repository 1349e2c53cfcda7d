"""The trainer's batch types and their shapes: what the train step (step.py) compiles for.

A `TrainBatch` is a frozen pytree dataclass of B rows padded to a shape bucket (seq_len T,
vision slots S, P step slots a row), so the step compiles once per bucket; `BucketSpec` lists
the buckets. An `RLBatch` is one curated GRPO batch laid out in microbatches of global rows
(`StepRef`s: a step of the batch's trajectories with its shape, no pixels), with every kept
step's reward, group and trajectory listed in layout order (the *_N arrays) so per-step
values decided over the whole batch reach each microbatch's step slots (`slot_steps`).

Sharding: a batch's rows are split over the mesh axes `ROWS`; every host holds its own rows
(`local_rows`, `host_shard`) and `to_global` makes globally sharded jax.Arrays of them.

Empty slots and padding rows have step_weight_BxP = 0 and an all-zero loss mask; losses must
weight steps by step_weight_BxP. Packing (P > 1): step j of row b is slot (b, j), numbered
j + 1 by the row's attention mask; its per-token arrays hold its values at its own positions
of row b and 0 elsewhere, and its per-step values are [B, P]. Unpacked (P = 1), a slot is a row.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Protocol, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from dart_jax.models.inputs import ModelInputs
from dart_jax.train.screens import ScreenSource
from dart_jax.wire.messages import Trajectory

ROWS = ("data", "fsdp")  # mesh axes of the batch dimension


class Shaped(Protocol):
    seq_len: int
    num_slots: int


@dataclass(frozen=True)
class StepShape:
    """What one step needs of a bucket: tokens and vision slots (windows padded)."""
    seq_len: int
    num_slots: int


@dataclass(frozen=True)
class Bucket:
    seq_len: int
    num_slots: int
    rows: int
    pack: int = 1  # step slots per row


@dataclass(frozen=True)
class BucketSpec:
    """Allowed padded shapes: every (seq_len, num_slots) pair, `rows` rows per batch, each
    holding up to `pack` steps. num_slots values must be multiples of the vision window's
    patch count."""
    seq_lens: tuple[int, ...]
    num_slots: tuple[int, ...]
    rows: int
    pack: int = 1

    def __post_init__(self) -> None:
        for name in ("seq_lens", "num_slots"):
            values = tuple(sorted(int(v) for v in getattr(self, name)))
            if not values or values[0] <= 0:
                raise ValueError(f"BucketSpec.{name} must be positive values, got {values}")
            object.__setattr__(self, name, values)
        if self.rows < 1 or self.pack < 1:
            raise ValueError(f"BucketSpec.rows and .pack must be >= 1, got {self.rows}, {self.pack}")

    def fits(self, item: Shaped) -> bool:
        return item.seq_len <= self.seq_lens[-1] and item.num_slots <= self.num_slots[-1]

    def choose_bucket(self, items: Sequence[Shaped]) -> Bucket:
        """The smallest (seq_len, num_slots) holding every item; at most `rows` items."""
        if not 0 < len(items) <= self.rows:
            raise ValueError(f"a batch holds 1..{self.rows} examples, got {len(items)}")
        t = max(i.seq_len for i in items)
        s = max(i.num_slots for i in items)
        seq = next((v for v in self.seq_lens if v >= t), None)
        slots = next((v for v in self.num_slots if v >= s), None)
        if seq is None or slots is None:
            raise ValueError(f"an example needs ({t} tokens, {s} slots); the largest bucket is "
                             f"({self.seq_lens[-1]}, {self.num_slots[-1]}): drop it with Collator.fit")
        return Bucket(seq, slots, self.rows, self.pack)


@dataclass(frozen=True)
class StepExample:
    """One step as an unpadded training row."""
    input_ids_T: np.ndarray  # int32: prompt + response
    targets_T: np.ndarray  # int32: input_ids_T shifted left by one, 0 at the end
    loss_mask_T: np.ndarray  # float32: 1 where targets_T is a response token
    rollout_logp_T: np.ndarray  # float32: the sampler's log-prob of targets_T (0 off the mask)
    pixel_values_NxD: np.ndarray  # float32 [patches, C*t*p*p], images in prompt order
    image_grid_thw_Ix3: np.ndarray  # int64
    num_slots: int
    task_id: str
    traj_id: str
    reward: float
    temperature: float
    policy_version: int
    is_demo: bool

    @property
    def seq_len(self) -> int:
        return len(self.input_ids_T)


@dataclass(frozen=True)
class TrainBatch:
    """B rows padded to one bucket (T tokens, S vision slots), P step slots a row. A JAX pytree."""
    inputs: ModelInputs  # input_ids/attention_mask [B, T], position_ids [3, B, T], vision [B, S, ...]
    targets_BxT: np.ndarray  # int32: each step's next tokens at its positions
    loss_mask_BxPxT: np.ndarray  # float32: step slot (b, j)'s response targets in row b
    rollout_logp_BxPxT: np.ndarray  # float32
    reward_BxP: np.ndarray  # float32: the trajectory's reward
    group_BxP: np.ndarray  # int32: task id within the batch (GRPO group)
    traj_BxP: np.ndarray  # int32: trajectory id within the batch
    step_weight_BxP: np.ndarray  # float32: 1 for real steps, 0 for empty slots and padding rows
    temperature_BxP: np.ndarray  # float32: the rollout's sampling temperature
    policy_version_BxP: np.ndarray  # int32: the policy version that sampled the step
    is_demo_BxP: np.ndarray  # bool: demonstration (no sampler log-probs; no importance weights)

    @property
    def rows(self) -> int:
        return self.targets_BxT.shape[0]


jax.tree_util.register_dataclass(
    TrainBatch, data_fields=[f.name for f in dataclasses.fields(TrainBatch)], meta_fields=[])


@dataclass(frozen=True)
class StepRef:
    """One step of the source's trajectories, with what it needs of a bucket."""
    traj: int
    step: int
    seq_len: int
    num_slots: int


Row = tuple[StepRef, ...]  # the steps one row holds, back to back


@dataclass(frozen=True)
class RLBatch:
    """One curated GRPO batch, laid out in microbatches of rows x hosts rows each.

    The *_N arrays list the kept steps in layout order (microbatch, global row, place in the row;
    this host's rows start at host_index * rows), and `slot_steps(m)` maps microbatch m's global
    step slots (row g, slot j: g * pack + j) to them, so per-step values computed over the whole
    batch (advantages.grpo_step_advantages(reward_N, group_N, traj_N, ones)) reach every
    microbatch's steps."""
    batch_id: int
    trainer_version: int
    trajectories: tuple[Trajectory, ...]
    screens: ScreenSource  # the trajectories' screenshots
    injected: tuple[str, ...]  # trajectory ids the data manager took from the pool
    layout: tuple[tuple[Row, ...], ...]  # global rows of each microbatch
    buckets: tuple[Bucket, ...]  # the bucket of each microbatch
    reward_N: np.ndarray  # float32: every kept step of the batch, in layout order
    group_N: np.ndarray  # int32: its task id within the batch (= group_BxP's numbering)
    traj_N: np.ndarray  # int32: its trajectory id within the batch (= traj_BxP's numbering)
    injected_N: np.ndarray  # bool: its trajectory came from the experience pool (`injected`)
    dropped: int  # steps too large for every bucket
    shard: tuple[int, int]

    def __len__(self) -> int:
        return len(self.layout)

    def slot_steps(self, m: int) -> np.ndarray:
        """int32 [rows * hosts * pack]: the layout-order step in each global step slot of
        microbatch m, -1 where a slot or row is empty."""
        bucket = self.buckets[m]
        out = np.full(bucket.rows * self.shard[1] * bucket.pack, -1, np.int32)
        first = sum(len(row) for rows in self.layout[:m] for row in rows)
        slots = [g * bucket.pack + j for g, row in enumerate(self.layout[m]) for j in range(len(row))]
        out[slots] = np.arange(first, first + len(slots))
        return out


def host_shard() -> tuple[int, int]:
    """(this process's index, process count): which rows of a global batch this host builds."""
    return jax.process_index(), jax.process_count()


def local_rows(rows: Sequence, per_host: int, shard: tuple[int, int]) -> list:
    """This host's `per_host` rows of a global batch's `rows`."""
    index, _ = shard
    return list(rows[index * per_host:(index + 1) * per_host])


def batch_specs(batch: TrainBatch, axes: tuple[str, ...] = ROWS) -> TrainBatch:
    """PartitionSpecs sharding every array's batch dimension over `axes` (position_ids: dim 1)."""
    rows = PartitionSpec(axes)
    inputs = jax.tree.map(lambda _: rows, batch.inputs)
    inputs = dataclasses.replace(inputs, position_ids=PartitionSpec(None, axes))
    return dataclasses.replace(jax.tree.map(lambda _: rows, batch), inputs=inputs)


def to_global(batch: TrainBatch, mesh: Mesh, specs: TrainBatch | None = None) -> TrainBatch:
    """Host-local rows -> global jax.Arrays on `mesh` (each host passes its own rows)."""
    specs = specs if specs is not None else batch_specs(batch)
    shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), specs,
                             is_leaf=lambda x: isinstance(x, PartitionSpec))
    return jax.make_array_from_process_local_data(shardings, batch)
