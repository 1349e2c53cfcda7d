"""Wire trajectories -> padded, bucketed train arrays, on the host (numpy; no torch).

What the train step (step.py) gets: a `TrainBatch`, a frozen pytree dataclass of B rows padded
to a shape bucket (seq_len T, vision slots S), so the step compiles once per bucket:

    collator = Collator.from_pretrained(hf_dir, BucketSpec(seq_lens=(1024, 4096),
                                                           num_slots=(512, 2048), rows=8))
    shapes = [collator.shape(traj, i) for i in range(len(traj.steps))]   # cheap: no pixels
    fitting = collator.fit(shapes)            # too large for every bucket: dropped, counted
    examples = collator.examples(traj)        # per step; each screenshot processed once
    batch = collator.collate(examples)        # smallest bucket that holds them; B = rows

Per step, the row is prompt + response ids (T = P + R) with next-token alignment:
`targets_T[t] = ids[t + 1]`, `loss_mask_T[t] = 1` exactly where ids[t + 1] is a response token
(t in [P - 1, P + R - 2]), and `rollout_logp_T[t]` the sampler's log-prob of that target. The
model's logits at position t predict targets_T[t], so `logp_T = token_logprobs(h_T, targets_T)`
lines up with rollout_logp_T and loss_mask_T directly. Pixel values are rebuilt from the
step's PNG screenshots with the numpy Qwen2-VL processor (bit-exact with what vLLM saw), and
`make_inputs` lays out mrope positions and the padded vision windows.

Padding rows (a partial batch) have step_weight_B = 0, an all-zero attention and loss mask;
losses must weight rows by step_weight_B. `group_B` numbers the tasks and `traj_B` the
trajectories of the batch in first-appearance order (or by the maps the caller passes, so
several microbatches of one curated batch share ids for GRPO's group statistics).
"""

from __future__ import annotations

import dataclasses
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Protocol, Sequence

import jax
import numpy as np
from PIL import Image

from dart_jax.models.config import Qwen25VLConfig
from dart_jax.models.hf_io import read_config
from dart_jax.models.image_processing import ImageProcessorConfig, preprocess_images
from dart_jax.models.inputs import ModelInputs, make_inputs
from dart_jax.wire.messages import Trajectory


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


@dataclass(frozen=True)
class BucketSpec:
    """Allowed padded shapes: every (seq_len, num_slots) pair, `rows` rows per batch.
    num_slots values must be multiples of the vision window's patch count."""
    seq_lens: tuple[int, ...]
    num_slots: tuple[int, ...]
    rows: int

    def __post_init__(self) -> None:
        for name in ("seq_lens", "num_slots"):
            values = tuple(sorted(int(v) for v in getattr(self, name)))
            if not values or values[0] <= 0:
                raise ValueError(f"BucketSpec.{name} must be positive values, got {values}")
            object.__setattr__(self, name, values)
        if self.rows < 1:
            raise ValueError(f"BucketSpec.rows must be >= 1, got {self.rows}")

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
        return Bucket(seq, slots, self.rows)


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
    """B rows padded to one bucket (T tokens, S vision slots). A JAX pytree."""
    inputs: ModelInputs  # input_ids/attention_mask [B, T], position_ids [3, B, T], vision [B, S, ...]
    targets_BxT: np.ndarray  # int32
    loss_mask_BxT: np.ndarray  # float32
    rollout_logp_BxT: np.ndarray  # float32
    reward_B: np.ndarray  # float32: the trajectory's reward
    group_B: np.ndarray  # int32: task id within the batch (GRPO group)
    traj_B: np.ndarray  # int32: trajectory id within the batch
    step_weight_B: np.ndarray  # float32: 1 for real rows, 0 for padding rows
    temperature_B: np.ndarray  # float32: the rollout's sampling temperature
    policy_version_B: np.ndarray  # int32: the policy version that sampled the step
    is_demo_B: np.ndarray  # bool: demonstration (no sampler log-probs; no importance weights)

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


def decode_png(png: bytes) -> Image.Image:
    """A screenshot as the rollout worker handed it to the processor (RGB)."""
    return Image.open(io.BytesIO(png)).convert("RGB")


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

    def shape(self, traj: Trajectory, i: int) -> StepShape:
        """Step i's needs, from the PNG headers only (no decoding)."""
        step = traj.steps[i]
        slots = sum(self.grid_slots(*self.image_cfg.grid_thw(*_png_hw(traj.screenshots[r])))
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

    def examples(self, traj: Trajectory, steps: Sequence[int] | None = None) -> list[StepExample]:
        """Examples of the given steps (all by default); each screenshot is processed once."""
        steps = range(len(traj.steps)) if steps is None else steps
        cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for i in steps:
            for r in traj.steps[i].image_refs:
                if r not in cache:
                    px = preprocess_images([decode_png(traj.screenshots[r])], self.image_cfg)
                    cache[r] = (px.pixel_values_NxD, px.image_grid_thw_Ix3)
        return [self._example(traj, i, cache) for i in steps]

    def _example(self, traj: Trajectory, i: int, cache) -> StepExample:
        step = traj.steps[i]
        ids, targets, mask, logp = align_step(step.prompt_ids, step.response_ids, step.logprobs)
        refs = step.image_refs
        pixels = (np.concatenate([cache[r][0] for r in refs]) if refs
                  else np.zeros((0, self.config.vision.patch_dim), np.float32))
        grids = np.concatenate([cache[r][1] for r in refs]) if refs else np.zeros((0, 3), np.int64)
        slots = sum(self.grid_slots(*g) for g in grids)
        return StepExample(ids, targets, mask, logp, pixels, grids, slots, traj.task_id, traj.traj_id,
                           float(traj.reward), float(traj.temperature), int(step.policy_version),
                           traj.source == "demo")

    def collate(self, examples: Sequence[StepExample], bucket: Bucket | None = None, *,
                groups: Mapping[str, int] | None = None,
                trajs: Mapping[str, int] | None = None) -> TrainBatch:
        """Pad `examples` into one TrainBatch of `bucket.rows` rows (chosen when not given; with
        a bucket, `examples` may be empty: all padding, as a host's share of a last batch can be).
        `groups` / `trajs` map task / trajectory ids to ints (first appearance by default)."""
        bucket = bucket or self.buckets.choose_bucket(examples)
        if len(examples) > bucket.rows:
            raise ValueError(f"{len(examples)} examples for a bucket of {bucket.rows} rows")
        groups = groups if groups is not None else dense_ids(e.task_id for e in examples)
        trajs = trajs if trajs is not None else dense_ids(e.traj_id for e in examples)
        b, t, n = bucket.rows, bucket.seq_len, len(examples)

        def rows(field: str, dtype) -> np.ndarray:
            out = np.zeros((b, t), dtype)
            for k, e in enumerate(examples):
                x = getattr(e, field)
                out[k, :len(x)] = x
            return out

        def per_row(values, dtype) -> np.ndarray:
            out = np.zeros(b, dtype)
            out[:n] = list(values)
            return out

        mask = np.zeros((b, t), np.int32)
        for k, e in enumerate(examples):
            mask[k, :e.seq_len] = 1
        pixels = np.concatenate([np.zeros((0, self.config.vision.patch_dim), np.float32)]
                                + [e.pixel_values_NxD for e in examples])
        grids = np.concatenate([np.zeros((0, 3), np.int64)] + [e.image_grid_thw_Ix3 for e in examples])
        inputs = make_inputs(self.config, rows("input_ids_T", np.int32), mask, pixels, grids,
                             seq_len=t, num_slots=bucket.num_slots)
        return TrainBatch(
            inputs=inputs,
            targets_BxT=rows("targets_T", np.int32),
            loss_mask_BxT=rows("loss_mask_T", np.float32),
            rollout_logp_BxT=rows("rollout_logp_T", np.float32),
            reward_B=per_row((e.reward for e in examples), np.float32),
            group_B=per_row((groups[e.task_id] for e in examples), np.int32),
            traj_B=per_row((trajs[e.traj_id] for e in examples), np.int32),
            step_weight_B=per_row([1.0] * n, np.float32),
            temperature_B=per_row((e.temperature for e in examples), np.float32),
            policy_version_B=per_row((e.policy_version for e in examples), np.int32),
            is_demo_B=per_row((e.is_demo for e in examples), np.bool_),
        )


def dense_ids(keys) -> dict[str, int]:
    out: dict[str, int] = {}
    for k in keys:
        out.setdefault(k, len(out))
    return out


def _png_hw(png: bytes) -> tuple[int, int]:
    """Height and width as the processor sees them (EXIF rotations swap the axes)."""
    with Image.open(io.BytesIO(png)) as im:
        if im.getexif().get(0x0112) in (5, 6, 7, 8):
            return im.width, im.height
        return im.height, im.width
