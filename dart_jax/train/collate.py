"""Wire trajectories -> padded, bucketed TrainBatches (batch.py), on the host (numpy; no torch).

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
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence

import numpy as np

from dart_jax.agent.image_processing import ImageProcessorConfig
from dart_jax.models.config import Qwen25VLConfig
from dart_jax.models.hf_io import read_config
from dart_jax.models.inputs import make_inputs
from dart_jax.train.batch import (Bucket, BucketSpec, RLBatch, Row, StepExample, StepRef, StepShape, TrainBatch,
                                  local_rows)
from dart_jax.train.screens import Processed, ScreenCache, ScreenSource
from dart_jax.wire.messages import ScreenshotRef, Step, Trajectory

StepFilter = Callable[[Trajectory, Step], bool]


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


def step_refs(trajs: Sequence[Trajectory], screens: ScreenSource, collator: Collator,
              keep: StepFilter) -> list[StepRef]:
    """The steps `keep` accepts and the collator can score, with their shapes (no pixels)."""
    return [StepRef(ti, si, *dataclasses.astuple(collator.shape(t, si, screens.refs(ti))))
            for ti, t in enumerate(trajs) for si, s in enumerate(t.steps)
            if keep(t, s) and collator.trainable(t, si)]


def build_rows(collator: Collator, trajs: Sequence[Trajectory], screens: ScreenSource,
               cache: ScreenCache, refs: Sequence[StepRef]) -> list[StepExample]:
    """The examples of `refs` (a host's steps), their screenshots taken from `cache` at once."""
    shas = [sha for r in refs for sha in collator.screenshots(trajs[r.traj], [r.step], screens.refs(r.traj))]
    pixels = cache.take(shas)
    return [collator.example(trajs[r.traj], r.step, screens.refs(r.traj), pixels) for r in refs]


def build_batch(collator: Collator, trajectories: Sequence[Trajectory], screens: ScreenSource,
                cache: ScreenCache, rows: Sequence[Row], bucket: Bucket, *, groups: dict[str, int],
                trajs: dict[str, int]) -> TrainBatch:
    """A host's `rows` collated into `bucket`; `groups` / `trajs` number tasks / trajectories."""
    examples = iter(build_rows(collator, trajectories, screens, cache, [r for row in rows for r in row]))
    return collator.collate_rows([[next(examples) for _ in row] for row in rows], bucket, groups=groups, trajs=trajs)


def rl_microbatches(batch: RLBatch, collator: Collator, cache: ScreenCache) -> Iterator[TrainBatch]:
    """This host's rows of each microbatch of `batch`, built on demand; their screenshots come
    from `cache` (one per batch: each fetched, decoded and preprocessed once)."""
    groups = dense_ids(t.task_id for t in batch.trajectories)
    trajs = dense_ids(t.traj_id for t in batch.trajectories)
    for rows, bucket in zip(batch.layout, batch.buckets):
        local = local_rows(rows, bucket.rows, batch.shard)
        yield build_batch(collator, batch.trajectories, batch.screens, cache, local, bucket,
                          groups=groups, trajs=trajs)
