"""Wire trajectories -> padded, bucketed train arrays, on the host (numpy; no torch).

What the train step (step.py) gets: a `TrainBatch`, a frozen pytree dataclass of B rows padded
to a shape bucket (seq_len T, vision slots S, P step slots a row), so the step compiles once per
bucket:

    collator = Collator.from_pretrained(hf_dir, BucketSpec(seq_lens=(1024, 4096),
                                                           num_slots=(512, 2048), rows=8))
    refs = screens.refs(ti)                   # trajectory ti's screenshots (train/screens.py)
    shapes = [collator.shape(traj, i, refs) for i in range(len(traj.steps))]   # no pixels
    fitting = collator.fit(shapes)            # too large for every bucket: dropped, counted
    pixels = cache.take(collator.screenshots(traj, steps, refs))   # processed once per batch
    examples = [collator.example(traj, i, refs, pixels) for i in steps]
    batch = collator.collate(examples)        # smallest bucket that holds them; B = rows
    batch = collator.collate_rows([[a, b], [c]])   # packed: steps a and b share row 0

Per step, the row is prompt + response ids (T = P + R) with next-token alignment:
`targets_T[t] = ids[t + 1]`, `loss_mask_T[t] = 1` exactly where ids[t + 1] is a response token
(t in [P - 1, P + R - 2]), and `rollout_logp_T[t]` the sampler's log-prob of that target. The
model's logits at position t predict targets_T[t], so `logp_T = token_logprobs(h_T, targets_T)`
lines up with rollout_logp_T and loss_mask_T directly. Pixel values are rebuilt from the
step's PNG screenshots with the numpy Qwen2-VL processor (bit-exact with what vLLM saw), and
`make_inputs` lays out mrope positions and the padded vision windows. Screenshots are named by
content (`ScreenshotRef`), so shapes come from their recorded sizes and pixels from a per-batch
cache, whether the bytes travel in the trajectory or are fetched by hash.

Packing: a row may hold up to P = `BucketSpec.pack` steps one after another, numbered 1..k by
the row's attention mask (make_inputs: each attends to itself only, its positions from 0), so
short steps fill what would be padding. The model reads rows ([B, T]); everything about steps
has a step-slot axis: step j of row b is slot (b, j), its per-token arrays (`loss_mask_BxPxT`,
`rollout_logp_BxPxT`) hold its values at its own positions of row b and 0 elsewhere, and its
per-step values are [B, P]. Unpacked (P = 1), a slot is a row.

Empty slots and padding rows have step_weight_BxP = 0 and an all-zero loss mask; losses must
weight steps by step_weight_BxP. `group_BxP` numbers the tasks and `traj_BxP` the trajectories
of the batch in first-appearance order (or by the maps the caller passes, so several
microbatches of one curated batch share ids for GRPO's group statistics).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Protocol, Sequence

import jax
import numpy as np

from dart_jax.models.config import Qwen25VLConfig
from dart_jax.models.hf_io import read_config
from dart_jax.agent.image_processing import ImageProcessorConfig
from dart_jax.models.inputs import ModelInputs, make_inputs
from dart_jax.train.screens import Processed
from dart_jax.wire.messages import ScreenshotRef, Trajectory


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


def align_step(prompt_ids: np.ndarray, response_ids: np.ndarray, logprobs: np.ndarray):
    """(input_ids_T, targets_T, loss_mask_T, rollout_logp_T) for one step (module docstring)."""
    p, r = len(prompt_ids), len(response_ids)
    if len(logprobs) != r:
        raise ValueError(f"{len(logprobs)} logprobs for {r} response tokens")
    if p == 0:
        raise ValueError("a step needs at least one prompt token")
    ids = np.concatenate([prompt_ids, response_ids]).astype(np.int32)
    targets = np.zeros_like(ids)
    targets[:-1] = ids[1:]
    mask = np.zeros(len(ids), np.float32)
    mask[p - 1:p + r - 1] = 1.0
    logp = np.zeros(len(ids), np.float32)
    logp[p - 1:p + r - 1] = logprobs
    return ids, targets, mask, logp


class Collator:
    """Steps -> StepExamples -> TrainBatches for one model; counts dropped examples."""

    def __init__(self, config: Qwen25VLConfig, image_cfg: ImageProcessorConfig, buckets: BucketSpec):
        self.config, self.image_cfg, self.buckets = config, image_cfg, buckets
        self.dropped = 0  # examples too large for every bucket (never truncated)
        wp = config.vision.window_patches
        if any(s % wp for s in buckets.num_slots):
            raise ValueError(f"BucketSpec.num_slots {buckets.num_slots} must be multiples of {wp}")

    @classmethod
    def from_pretrained(cls, hf_dir: str | Path, buckets: BucketSpec) -> "Collator":
        return cls(read_config(hf_dir), ImageProcessorConfig.from_pretrained(hf_dir), buckets)

    def grid_slots(self, t: int, h: int, w: int) -> int:
        """Vision slots an image of patch grid (t, h, w) takes in make_inputs' window layout:
        each frame's merged grid is cut into windows, every window padded to full size."""
        v = self.config.vision
        windows = lambda n: -(-(n // v.spatial_merge_size) // v.window_merged)  # noqa: E731
        return int(t * windows(h) * windows(w) * v.window_patches)

    def shape(self, traj: Trajectory, i: int, refs: Sequence[ScreenshotRef]) -> StepShape:
        """Step i's needs, from the sizes of its screenshots `refs` (no pixels)."""
        step = traj.steps[i]
        slots = sum(self.grid_slots(*self.image_cfg.grid_thw(refs[r].height, refs[r].width))
                    for r in step.image_refs)
        return StepShape(len(step.prompt_ids) + len(step.response_ids), slots)

    def trainable(self, traj: Trajectory, i: int) -> bool:
        """Whether step i can be scored exactly: all of its response from one policy version
        (no weight update landed inside it) and no vision-layout token in the response (a
        sampled <|image_pad|> or <|video_pad|>, which only an untrained policy emits, would
        shift where the screenshots go)."""
        step = traj.steps[i]
        c = self.config
        vision = (c.image_token_id, c.video_token_id, c.vision_start_token_id, c.vision_end_token_id)
        return not step.straddles_update and not np.isin(step.response_ids, vision).any()

    def fit(self, items: Sequence) -> list:
        """The items some bucket holds; the rest are counted in `dropped`."""
        kept = [x for x in items if self.buckets.fits(x)]
        self.dropped += len(items) - len(kept)
        return kept

    @staticmethod
    def screenshots(traj: Trajectory, steps: Sequence[int], refs: Sequence[ScreenshotRef]) -> list[str]:
        """The sha256 of every screenshot the given steps show, in prompt order."""
        return [refs[r].sha256 for i in steps for r in traj.steps[i].image_refs]

    def example(self, traj: Trajectory, i: int, refs: Sequence[ScreenshotRef],
                pixels: Mapping[str, Processed]) -> StepExample:
        """Step i as a row; `pixels` holds its screenshots processed (ScreenCache.take)."""
        step = traj.steps[i]
        ids, targets, mask, logp = align_step(step.prompt_ids, step.response_ids, step.logprobs)
        shown = [pixels[refs[r].sha256] for r in step.image_refs]
        patches = np.concatenate([np.zeros((0, self.config.vision.patch_dim), np.float32)]
                                 + [p.pixel_values_NxD for p in shown])
        grids = np.asarray([p.grid_thw for p in shown], np.int64).reshape(-1, 3)
        slots = sum(self.grid_slots(*g) for g in grids)
        return StepExample(ids, targets, mask, logp, patches, grids, slots, traj.task_id, traj.traj_id,
                           float(traj.reward), float(traj.temperature), int(step.policy_version),
                           traj.source == "demo")

    def collate(self, examples: Sequence[StepExample], bucket: Bucket | None = None, *,
                groups: Mapping[str, int] | None = None,
                trajs: Mapping[str, int] | None = None) -> TrainBatch:
        """One step a row: `collate_rows` with each example in a row of its own."""
        return self.collate_rows([[e] for e in examples], bucket, groups=groups, trajs=trajs)

    def collate_rows(self, rows: Sequence[Sequence[StepExample]], bucket: Bucket | None = None, *,
                     groups: Mapping[str, int] | None = None,
                     trajs: Mapping[str, int] | None = None) -> TrainBatch:
        """Pad `rows` (each up to `pack` steps, back to back) into one TrainBatch of `bucket.rows`
        rows (chosen when not given; with a bucket, `rows` may be empty: all padding, as a host's
        share of a last batch can be). `groups` / `trajs` map task / trajectory ids to ints
        (first appearance by default)."""
        shapes = [StepShape(sum(e.seq_len for e in r), sum(e.num_slots for e in r)) for r in rows]
        bucket = bucket or self.buckets.choose_bucket(shapes)
        if len(rows) > bucket.rows or any(not 0 < len(r) <= bucket.pack for r in rows):
            raise ValueError(f"{[len(r) for r in rows]} steps in rows for a bucket of {bucket.rows} "
                             f"rows of 1..{bucket.pack} steps")
        steps = [e for r in rows for e in r]
        groups = groups if groups is not None else dense_ids(e.task_id for e in steps)
        trajs = trajs if trajs is not None else dense_ids(e.traj_id for e in steps)
        b, p, t = bucket.rows, bucket.pack, bucket.seq_len
        placed = [(k, j, sum(x.seq_len for x in r[:j]), e) for k, r in enumerate(rows) for j, e in enumerate(r)]

        def tokens(value, dtype) -> np.ndarray:  # [B, T]: each step's value at its positions
            out = np.zeros((b, t), dtype)
            for k, j, at, e in placed:
                out[k, at:at + e.seq_len] = value(j, e)
            return out

        def slot_tokens(field: str) -> np.ndarray:  # [B, P, T]: slot (k, j) at its positions
            out = np.zeros((b, p, t), np.float32)
            for k, j, at, e in placed:
                out[k, j, at:at + e.seq_len] = getattr(e, field)
            return out

        def per_slot(value, dtype) -> np.ndarray:  # [B, P]
            out = np.zeros((b, p), dtype)
            for k, j, _, e in placed:
                out[k, j] = value(e)
            return out

        pixels = np.concatenate([np.zeros((0, self.config.vision.patch_dim), np.float32)]
                                + [e.pixel_values_NxD for e in steps])
        grids = np.concatenate([np.zeros((0, 3), np.int64)] + [e.image_grid_thw_Ix3 for e in steps])
        sequence_BxT = tokens(lambda j, e: j + 1, np.int32)  # the attention mask numbers a row's steps
        inputs = make_inputs(self.config, tokens(lambda j, e: e.input_ids_T, np.int32), sequence_BxT,
                             pixels, grids, seq_len=t, num_slots=bucket.num_slots, packed=p > 1)
        return TrainBatch(
            inputs=inputs,
            targets_BxT=tokens(lambda j, e: e.targets_T, np.int32),
            loss_mask_BxPxT=slot_tokens("loss_mask_T"),
            rollout_logp_BxPxT=slot_tokens("rollout_logp_T"),
            reward_BxP=per_slot(lambda e: e.reward, np.float32),
            group_BxP=per_slot(lambda e: groups[e.task_id], np.int32),
            traj_BxP=per_slot(lambda e: trajs[e.traj_id], np.int32),
            step_weight_BxP=per_slot(lambda e: 1.0, np.float32),
            temperature_BxP=per_slot(lambda e: e.temperature, np.float32),
            policy_version_BxP=per_slot(lambda e: e.policy_version, np.int32),
            is_demo_BxP=per_slot(lambda e: e.is_demo, np.bool_),
        )


def dense_ids(keys) -> dict[str, int]:
    out: dict[str, int] = {}
    for k in keys:
        out.setdefault(k, len(out))
    return out

