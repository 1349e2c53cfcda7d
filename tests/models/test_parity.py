"""Flax forward vs transformers' Qwen2_5_VLForConditionalGeneration (fp32, eager attention)."""

import numpy as np
import pytest

from dart_jax.models.inputs import make_inputs
from dart_jax.policy import load_hf
from tests.models import hf_reference as R

TOL = 1e-4
pytestmark = pytest.mark.parametrize("name", sorted(R.CONFIGS))


@pytest.fixture
def pair(hf_models, name):
    path, hf = hf_models[name]
    return load_hf(path), hf


def tokens(rng, n):
    return list(rng.integers(2, 200, n))


def ours(policy, *args, **kw):
    return policy.logits_for(make_inputs(policy.config, *args, **kw))


def test_text_only_padded_batch(pair, name):
    model, hf = pair
    rng = np.random.default_rng(1)
    rows = [tokens(rng, 7), tokens(rng, 12), tokens(rng, 3)]
    ids, mask = R.batch(rows, pad="right")
    ref = R.hf_logits(hf, ids, mask)
    assert np.abs(ours(model, ids, mask) - ref)[mask > 0].max() <= TOL
    # left padding: positions count attended tokens only, so each row matches its unpadded run
    ids, mask = R.batch(rows, pad="left")
    out = ours(model, ids, mask)
    for i, row in enumerate(rows):
        ref = R.hf_logits(hf, np.array([row]))[0]
        assert np.abs(out[i, -len(row):] - ref).max() <= TOL


def test_one_image(pair, name):
    model, hf = pair
    rng = np.random.default_rng(2)
    pv, grid = R.images([(56, 84)])
    ids, mask = R.batch([tokens(rng, 3) + R.image_tokens(grid[0]) + tokens(rng, 5)])
    ref = R.hf_logits(hf, ids, mask, pv, grid)
    assert np.abs(ours(model, ids, mask, pv, grid) - ref).max() <= TOL


@pytest.mark.parametrize("pad", ["left", "right"])
def test_several_images_padded_batch(pair, name, pad):
    model, hf = pair
    rng = np.random.default_rng(3)
    pv, grid = R.images([(56, 84), (112, 56), (84, 140), (56, 56)], seed=3)
    rows = [
        tokens(rng, 3) + R.image_tokens(grid[0]) + tokens(rng, 2) + R.image_tokens(grid[1]) + tokens(rng, 4),
        tokens(rng, 6) + R.image_tokens(grid[2]) + tokens(rng, 2),
        tokens(rng, 2) + R.image_tokens(grid[3]) + tokens(rng, 1),
    ]
    ids, mask = R.batch(rows, pad=pad)
    ref = R.hf_logits(hf, ids, mask, pv, grid)
    out = ours(model, ids, mask, pv, grid)
    assert np.abs(out - ref)[mask > 0].max() <= TOL
    # bucketed shapes (longer sequence, more slots) change nothing at attended positions
    window = model.config.vision.window_patches
    slots = make_inputs(model.config, ids, mask, pv, grid).pixel_values.shape[1] + 2 * window
    padded = ours(model, ids, mask, pv, grid, seq_len=ids.shape[1] + 5, num_slots=slots)
    assert np.abs(padded[:, : ids.shape[1]] - out)[mask > 0].max() <= 1e-5
