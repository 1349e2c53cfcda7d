"""Host-side (numpy) preparation of everything data-dependent, so the forward has static shapes.

`make_inputs(config, input_ids, attention_mask, pixel_values, image_grid_thw, seq_len=, num_slots=)`
takes the arrays transformers' processor returns and computes:

- `position_ids` [3, B, T]: multimodal rotary positions, transformers' `get_rope_index` (text
  tokens count 1 each; an image's tokens take (t, h, w) grid positions offset by the running
  position; the next text resumes after max(h, w) of the merged grid). Positions count only
  attended tokens, so left padding does not shift them; padded positions get 0.
- packed rows: `attention_mask` may number sequences sharing a row (1, 2, ... in row order;
  0 is padding) when `packed=True`. Each sequence attends only to itself and its positions
  start at 0, so its outputs equal those of the sequence in a row of its own. transformers'
  0/1 mask is the one-sequence case. `packed` is static (a pytree meta field): the decoder
  then never takes a single-segment kernel.
- the vision layout, per batch row: each image's merge units are ordered window by window
  (transformers' `get_vision_window_index`), and every window is padded to `window_patches`
  slots. `pixel_values` [B, S, C*t*p*p] holds the row's patches in that slot order (zeros in pad
  slots), `vision_position_ids` [B, S, 2] their (h, w) patch coordinates for the 2D rotary, and
  `vision_segment_ids` [B, S] their frame index within the row (-1 for pad slots): full attention
  attends within a segment, window attention within a window of W consecutive slots.
- `image_token_index` [B, T]: for each image placeholder token, the row of the merged visual
  output ([B, S / merge_unit, D]) that replaces its embedding; -1 elsewhere.

Pass `seq_len` and `num_slots` (a multiple of `window_patches`) to pad to bucketed shapes: a
trainer compiles once per (B, seq_len, num_slots). Images are assigned to rows in order: the k-th
run of image tokens in row-major order uses the k-th entry of `image_grid_thw`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import jax
import numpy as np

from dart_jax.models.config import Qwen25VLConfig, VisionConfig


@dataclass(frozen=True)
class ModelInputs:
    input_ids: np.ndarray  # [B, T] int32
    attention_mask: np.ndarray  # [B, T] int32, 1 = attended token
    position_ids: np.ndarray  # [3, B, T] int32
    image_token_index: np.ndarray | None = None  # [B, T] int32
    pixel_values: np.ndarray | None = None  # [B, S, C*t*p*p] float32
    vision_position_ids: np.ndarray | None = None  # [B, S, 2] int32
    vision_segment_ids: np.ndarray | None = None  # [B, S] int32
    packed: bool = False  # static: rows may hold several sequences (attention_mask numbers them)

    @property
    def has_vision(self) -> bool:
        return self.pixel_values is not None


jax.tree_util.register_dataclass(
    ModelInputs, data_fields=[f.name for f in dataclasses.fields(ModelInputs) if f.name != "packed"],
    meta_fields=["packed"]
)


def make_inputs(
    config: Qwen25VLConfig,
    input_ids,
    attention_mask=None,
    pixel_values=None,
    image_grid_thw=None,
    *,
    seq_len: int | None = None,
    num_slots: int | None = None,
    packed: bool = False,
) -> ModelInputs:
    ids = np.asarray(input_ids, dtype=np.int64)
    if ids.ndim != 2:
        raise ValueError(f"input_ids must be [B, T], got shape {ids.shape}")
    mask = np.ones_like(ids) if attention_mask is None else np.asarray(attention_mask).astype(np.int64)
    if mask.shape != ids.shape:
        raise ValueError(f"attention_mask shape {mask.shape} != input_ids shape {ids.shape}")
    if mask.size and (mask.min() < 0 or mask.max() > (np.iinfo(np.int32).max if packed else 1)):
        raise ValueError(f"attention_mask holds 0/1{' or sequence numbers' if packed else ''}, "
                         f"got values in [{mask.min()}, {mask.max()}]")
    if np.any((ids == config.video_token_id) & (mask > 0)):
        raise ValueError("video inputs are not supported (found video_token_id in input_ids)")
    ids, mask = _pad_seq(ids, mask, seq_len)
    grids = np.zeros((0, 3), np.int64) if image_grid_thw is None else np.asarray(image_grid_thw, np.int64).reshape(-1, 3)
    runs = [_image_runs(ids[b], mask[b], config.image_token_id) for b in range(len(ids))]
    row_grids = _assign_images(runs, grids, config.vision.spatial_merge_size)
    merge = config.vision.spatial_merge_size
    position_ids = np.stack([_row_positions(ids[b], mask[b], runs[b], row_grids[b], merge) for b in range(len(ids))],
                            axis=1)
    inputs = ModelInputs(ids.astype(np.int32), mask.astype(np.int32), position_ids.astype(np.int32), packed=packed)
    if len(grids) == 0 and not num_slots:
        if pixel_values is not None and len(pixel_values):
            raise ValueError("pixel_values given without image tokens / image_grid_thw")
        return inputs
    return _with_vision(inputs, config.vision, runs, row_grids, grids, pixel_values, num_slots)


def _pad_seq(ids, mask, seq_len):
    b, t = ids.shape
    if seq_len is None or seq_len == t:
        return ids, mask
    if seq_len < t:
        raise ValueError(f"seq_len {seq_len} shorter than the batch's {t} tokens")
    pad = ((0, 0), (0, seq_len - t))
    return np.pad(ids, pad), np.pad(mask, pad)


def _image_runs(ids_T, mask_T, image_token_id) -> list[tuple[int, int]]:
    """(start, end) index ranges of consecutive attended image tokens of one sequence."""
    key = np.where(ids_T == image_token_id, mask_T, 0)  # a run ends where its sequence does
    edges = np.flatnonzero(np.diff(np.concatenate([[0], key, [0]])))
    return [(a, e) for a, e in zip(edges[:-1].tolist(), edges[1:].tolist()) if key[a] > 0]


def _assign_images(runs, grids, merge) -> list[np.ndarray]:
    n_runs = sum(len(r) for r in runs)
    if n_runs != len(grids):
        raise ValueError(f"input_ids hold {n_runs} runs of image tokens but image_grid_thw has {len(grids)} images")
    out, k = [], 0
    for row in runs:
        g = grids[k : k + len(row)]
        for (start, end), (t, h, w) in zip(row, g.tolist()):
            if h % merge or w % merge or end - start != t * h * w // merge**2:
                raise ValueError(f"image with grid {(t, h, w)} needs {t * h * w // merge**2} tokens, found {end - start}")
        out.append(g)
        k += len(row)
    return out


def _row_positions(ids_T, mask_T, runs, grids, merge) -> np.ndarray:
    """Positions of one row: each sequence of a packed row on its own, from 0."""
    pos = np.zeros((3, len(ids_T)), np.int64)
    seq_of_run = [mask_T[a] for a, _ in runs]
    for seq in np.unique(mask_T[mask_T > 0]):
        mine = [k for k, s in enumerate(seq_of_run) if s == seq]
        pos += _rope_index(ids_T, mask_T == seq, [runs[k] for k in mine], grids[mine], merge)
    return pos


def _rope_index(ids_T, mask_T, runs, grids, merge) -> np.ndarray:
    pos = np.zeros((3, len(ids_T)), np.int64)
    valid = np.flatnonzero(mask_T > 0)
    where = np.full(len(ids_T), -1)
    where[valid] = np.arange(len(valid))  # index among attended tokens
    cur, done = 0, 0
    for (start, end), (t, h, w) in zip(runs, grids):
        a, b = where[start], where[end - 1] + 1
        text = valid[done:a]
        pos[:, text] = np.arange(len(text)) + cur
        cur += len(text)
        tt, hh, ww = np.meshgrid(np.arange(t), np.arange(h // merge), np.arange(w // merge), indexing="ij")
        pos[:, valid[a:b]] = np.stack([tt.ravel(), hh.ravel(), ww.ravel()]) + cur
        cur += max(h, w) // merge
        done = b
    text = valid[done:]
    pos[:, text] = np.arange(len(text)) + cur
    return pos


def _with_vision(inputs, vcfg: VisionConfig, runs, row_grids, grids, pixel_values, num_slots) -> ModelInputs:
    b, t = inputs.input_ids.shape
    n_patches = int(np.prod(grids, axis=1).sum()) if len(grids) else 0
    pv = np.zeros((0, vcfg.patch_dim), np.float32) if pixel_values is None else np.asarray(pixel_values, np.float32)
    if pv.shape != (n_patches, vcfg.patch_dim):
        raise ValueError(f"pixel_values shape {pv.shape} != ({n_patches}, {vcfg.patch_dim}) from image_grid_thw")
    starts = np.concatenate([[0], np.cumsum(np.prod(grids, axis=1))]) if len(grids) else np.zeros(1, np.int64)
    layouts, k = [], 0
    for row in row_grids:
        layouts.append(_row_layout(vcfg, row, starts[k : k + len(row)]))
        k += len(row)
    need = max(len(src) for src, *_ in layouts)
    s = need if num_slots is None else num_slots
    if s < need or s % vcfg.window_patches:
        raise ValueError(f"num_slots {s} must be a multiple of {vcfg.window_patches} and >= {need}")
    src = np.full((b, s), -1, np.int64)
    seg = np.full((b, s), -1, np.int32)
    pos2 = np.zeros((b, s, 2), np.int32)
    token_index = np.full((b, t), -1, np.int32)
    for i, (row_src, row_seg, row_pos, unit_rows) in enumerate(layouts):
        n = len(row_src)
        src[i, :n], seg[i, :n], pos2[i, :n] = row_src, row_seg, row_pos
        tokens = np.concatenate([np.arange(a, e) for a, e in runs[i]]) if runs[i] else np.zeros(0, np.int64)
        token_index[i, tokens] = unit_rows
    patches = np.zeros((b, s, vcfg.patch_dim), np.float32)
    if len(pv):
        patches = np.where((src >= 0)[..., None], pv[np.maximum(src, 0)], 0.0).astype(np.float32)
    return dataclasses.replace(
        inputs, image_token_index=token_index, pixel_values=patches, vision_position_ids=pos2, vision_segment_ids=seg
    )


def _row_layout(vcfg: VisionConfig, grids, starts):
    """Slot arrays of one row: patch source rows, segment ids, (h, w) positions, merged row per unit."""
    srcs, segs, poss, unit_rows = [], [], [], []
    offset, frame = 0, 0
    mu = vcfg.merge_unit
    for (t, h, w), start in zip(grids, starts):
        hw_pos = _patch_positions(h, w, vcfg.spatial_merge_size)
        lh, lw = h // vcfg.spatial_merge_size, w // vcfg.spatial_merge_size
        win = _window_units(lh, lw, vcfg.window_merged)  # [n_windows, wm*wm] unit ids, -1 pad
        slot_of_unit = np.empty(t * lh * lw, np.int64)
        for f in range(t):
            units = np.where(win >= 0, win + f * lh * lw, -1).ravel()
            patch = (units[:, None] * mu + np.arange(mu)).ravel()
            patch = np.where(np.repeat(units >= 0, mu), patch, -1)
            real = units >= 0
            slot_of_unit[units[real]] = offset + np.flatnonzero(real) * mu
            srcs.append(np.where(patch >= 0, patch + start, -1))
            segs.append(np.where(patch >= 0, frame, -1))
            poss.append(np.where((patch >= 0)[:, None], hw_pos[np.maximum(patch, 0) % (h * w)], 0))
            offset += len(patch)
            frame += 1
        unit_rows.append(slot_of_unit // mu)
    cat = lambda xs, shape: np.concatenate(xs) if xs else np.zeros(shape, np.int64)  # noqa: E731
    return cat(srcs, (0,)), cat(segs, (0,)), cat(poss, (0, 2)), cat(unit_rows, (0,))


def _patch_positions(h, w, merge) -> np.ndarray:
    """(h, w) of each patch of one frame in the processor's merge-block-major row order."""
    hh, ww = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    block = lambda a: a.reshape(h // merge, merge, w // merge, merge).transpose(0, 2, 1, 3).ravel()  # noqa: E731
    return np.stack([block(hh), block(ww)], axis=-1)


def _window_units(lh, lw, wm) -> np.ndarray:
    """Merge-unit ids of each window (row-major inside), valid ids first, -1 padding."""
    nh, nw = -(-lh // wm), -(-lw // wm)
    grid = np.full((nh * wm, nw * wm), -1, np.int64)
    grid[:lh, :lw] = np.arange(lh * lw).reshape(lh, lw)
    win = grid.reshape(nh, wm, nw, wm).transpose(0, 2, 1, 3).reshape(nh * nw, wm * wm)
    order = np.argsort(win < 0, axis=1, kind="stable")
    return np.take_along_axis(win, order, axis=1)
