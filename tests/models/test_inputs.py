"""Host-side inputs against transformers' own get_rope_index and get_vision_window_index."""

import numpy as np
import pytest

from dart_jax.models.config import Qwen25VLConfig
from dart_jax.models.inputs import make_inputs
from tests.models import hf_reference as R

GRIDS = np.array([[1, 4, 6], [1, 8, 4], [1, 6, 10], [1, 2, 2]])


def config(name="a"):
    return Qwen25VLConfig.from_hf(R.hf_config(name).to_dict())


def rows():
    return [
        [5, 6] + R.image_tokens(GRIDS[0]) + [7] + R.image_tokens(GRIDS[1]) + [8, 9],
        [4] * 9 + R.image_tokens(GRIDS[2]),
        [3] + R.image_tokens(GRIDS[3]),
    ]


@pytest.mark.parametrize("pad", ["left", "right"])
def test_rope_index_matches_transformers(hf_models, pad):
    import torch

    hf = hf_models["a"][1]
    ids, mask = R.batch(rows(), pad=pad)
    ref, _ = hf.model.get_rope_index(torch.as_tensor(ids), torch.as_tensor((ids == R.IMAGE).astype(np.int64)),
                                     image_grid_thw=torch.as_tensor(GRIDS), attention_mask=torch.as_tensor(mask))
    pv = np.zeros((int(GRIDS.prod(1).sum()), config().vision.patch_dim), np.float32)
    ours = make_inputs(config(), ids, mask, pv, GRIDS).position_ids
    assert np.array_equal(ours[:, mask > 0], ref.numpy()[:, mask > 0])


@pytest.mark.parametrize("name", sorted(R.CONFIGS))
def test_window_layout_matches_transformers(name):
    import torch
    from transformers.vision_utils import get_vision_window_index

    cfg = config(name)
    v = cfg.vision
    ids, mask = R.batch([sum((R.image_tokens(g) for g in GRIDS), [])])
    n = int(GRIDS.prod(1).sum())
    pv = np.arange(n, dtype=np.float32)[:, None].repeat(v.patch_dim, 1)  # row i holds i
    inputs = make_inputs(cfg, ids, mask, pv, GRIDS)
    window_index, cu = get_vision_window_index(torch.as_tensor(GRIDS), v.spatial_merge_size, v.window_size, v.patch_size)
    slots = inputs.pixel_values[0, :, 0].astype(int)
    valid = inputs.vision_segment_ids[0] >= 0
    assert np.array_equal(slots[valid][:: v.merge_unit] // v.merge_unit, window_index.numpy())
    # every transformers window is one W-slot window here, padded at its end
    lengths = np.diff(cu.numpy())
    per_window = valid.reshape(-1, v.window_patches).sum(1)
    assert np.array_equal(per_window, lengths)
    # image tokens read the merged row of their own merge unit
    unit = slots.reshape(-1, v.merge_unit)[:, 0] // v.merge_unit
    picked = unit[inputs.image_token_index[0][ids[0] == R.IMAGE]]
    assert np.array_equal(picked, np.arange(n // v.merge_unit))


def test_bad_inputs_are_named():
    cfg = config()
    pv = np.zeros((24, cfg.vision.patch_dim), np.float32)
    ids, _ = R.batch([[1] + R.image_tokens(GRIDS[0])])
    with pytest.raises(ValueError, match="2 runs of image tokens but image_grid_thw has 1"):
        make_inputs(cfg, np.concatenate([ids, ids], 1), None, pv, GRIDS[:1])
    with pytest.raises(ValueError, match=r"grid \(1, 8, 4\) needs 8 tokens, found 6"):
        make_inputs(cfg, ids, None, np.zeros((32, cfg.vision.patch_dim)), GRIDS[1:2])
    with pytest.raises(ValueError, match="pixel_values shape"):
        make_inputs(cfg, ids, None, pv[:5], GRIDS[:1])
    with pytest.raises(ValueError, match="num_slots 20 must be a multiple of 16"):
        make_inputs(cfg, ids, None, pv, GRIDS[:1], num_slots=20)
    with pytest.raises(ValueError, match="video inputs are not supported"):
        make_inputs(cfg, np.array([[R.VIDEO, 3]]))
    with pytest.raises(ValueError, match="seq_len 3 shorter"):
        make_inputs(cfg, ids, seq_len=3)
