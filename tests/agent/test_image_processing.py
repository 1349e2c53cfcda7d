"""dart_jax.agent.image_processing against transformers' Qwen2VLImageProcessor and torch.

vLLM builds pixel values with transformers' torchvision backend; equality here is exact
(np.array_equal on float32), not a tolerance.
"""

import json
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image, ImageDraw

from dart_jax.agent.image_processing import (ImageProcessorConfig, normalize, patchify,
                                              preprocess_images, resize_bicubic_u8, smart_resize,
                                              to_rgb_array)

UI_TARS = ImageProcessorConfig(min_pixels=100 * 28 * 28, max_pixels=16384 * 28 * 28)


def _noise(h, w, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def _ui_screenshot(h, w):
    """Flat colours, hard edges and text: what screenshots look like."""
    im = Image.new("RGB", (w, h), (245, 245, 245))
    d = ImageDraw.Draw(im)
    for i in range(0, w, 97):
        d.rectangle([i, 10, i + 60, 40], fill=(30, 100 + i % 150, 200), outline=(0, 0, 0))
    for j in range(60, h, 23):
        d.text((8, j), f"Row {j}: Submit  Cancel  [x] option", fill=(10, 10, 10))
    return np.asarray(im)


# (height, width, image processor config): up-scaling to min_pixels, slight up-scaling,
# down-scaling past max_pixels, an extreme aspect ratio, a tiny image, an exact fit.
CASES = [
    (210, 160, UI_TARS),
    (1080, 1920, UI_TARS),
    (57, 913, UI_TARS),
    (28, 28, UI_TARS),
    (1500, 2600, ImageProcessorConfig()),
    (812, 1148, ImageProcessorConfig(max_pixels=512 * 28 * 28)),
    (448, 448, ImageProcessorConfig()),
]


def _hf_processor(cfg: ImageProcessorConfig, tmp_path):
    """transformers' processor read from the same preprocessor_config.json, as vLLM loads it
    (skipped only where transformers is not installed)."""
    transformers = pytest.importorskip("transformers")
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(cfg.to_dict()))
    proc = transformers.AutoImageProcessor.from_pretrained(tmp_path)
    assert proc.backend == "torchvision", "vLLM uses the torchvision backend; compare with that"
    return proc


def test_smart_resize_ui_tars_facts():
    assert smart_resize(1080, 1920, 28, 100 * 28 * 28, 16384 * 28 * 28) == (1092, 1932)
    assert UI_TARS.num_image_tokens(1080, 1920) == 2691
    assert smart_resize(210, 160, 28, 100 * 28 * 28, 16384 * 28 * 28) == (336, 252)
    with pytest.raises(ValueError, match="aspect ratio"):
        smart_resize(10, 2500)


@pytest.mark.parametrize("h, w", [(1, 1), (57, 913), (1080, 1920), (4000, 3000), (333, 777), (5, 900)])
def test_smart_resize_bounds(h, w):
    for lo, hi in [(56 * 56, 28 * 28 * 1280), (100 * 28 * 28, 16384 * 28 * 28)]:
        rh, rw = smart_resize(h, w, 28, lo, hi)
        assert rh % 28 == 0 and rw % 28 == 0
        assert lo <= rh * rw <= hi


def test_smart_resize_matches_transformers():
    pytest.importorskip("transformers")
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize as hf_smart_resize
    rng = np.random.default_rng(0)
    for h, w in rng.integers(1, 5000, size=(300, 2)):
        if max(h, w) / min(h, w) > 200:
            continue
        for lo, hi in [(56 * 56, 28 * 28 * 1280), (100 * 28 * 28, 16384 * 28 * 28)]:
            assert smart_resize(int(h), int(w), 28, lo, hi) == hf_smart_resize(int(h), int(w), 28, lo, hi)


@pytest.mark.parametrize("h, w, nh, nw", [
    (210, 160, 336, 252), (1080, 1920, 1092, 1932), (3000, 2000, 1000, 700), (57, 913, 56, 924),
    (37, 53, 280, 364), (1, 300, 28, 8400), (800, 600, 28, 28), (500, 500, 500, 300),
])
def test_resize_is_torch_uint8_bicubic_antialias(h, w, nh, nw):
    torch = pytest.importorskip("torch")
    a = _noise(h, w, seed=h * w)
    t = torch.from_numpy(a).permute(2, 0, 1)[None]
    ref = torch.nn.functional.interpolate(t, size=(nh, nw), mode="bicubic", align_corners=False,
                                          antialias=True)[0].permute(1, 2, 0).numpy()
    assert np.array_equal(resize_bicubic_u8(a, nh, nw), ref)


def test_resize_random_sizes_match_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(7)
    for _ in range(25):
        h, w, nh, nw = (int(v) for v in rng.integers(1, 700, 4))
        a = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        t = torch.from_numpy(a).permute(2, 0, 1)[None]
        ref = torch.nn.functional.interpolate(t, size=(nh, nw), mode="bicubic", align_corners=False,
                                              antialias=True)[0].permute(1, 2, 0).numpy()
        assert np.array_equal(resize_bicubic_u8(a, nh, nw), ref), (h, w, nh, nw)


def test_resize_differs_from_pil_so_pil_is_not_the_reference():
    a = _noise(57, 913)
    pil = np.asarray(Image.fromarray(a).resize((924, 56), Image.BICUBIC))
    assert not np.array_equal(resize_bicubic_u8(a, 56, 924), pil)


def test_normalize_matches_fused_torch_ops():
    torch = pytest.importorskip("torch")
    a = _noise(56, 84)
    cfg = ImageProcessorConfig()
    mean = torch.tensor(cfg.image_mean) * (1.0 / cfg.rescale_factor)
    std = torch.tensor(cfg.image_std) * (1.0 / cfg.rescale_factor)
    x = torch.from_numpy(a).permute(2, 0, 1).to(torch.float32)
    ref = x.sub(mean.view(-1, 1, 1)).div(std.view(-1, 1, 1)).numpy()
    assert np.array_equal(normalize(a, cfg), ref)


def test_patchify_layout():
    cfg = ImageProcessorConfig()
    x = np.arange(3 * 56 * 84, dtype=np.float32).reshape(3, 56, 84)
    p = patchify(x, cfg)
    assert p.shape == (4 * 6, 3 * 2 * 14 * 14)
    # Row 1 is the second patch of the first 2x2 merge window: patch row 0, patch column 1.
    row = p[1].reshape(3, 2, 14, 14)
    assert np.array_equal(row[:, 0], x[:, 0:14, 14:28]) and np.array_equal(row[:, 1], x[:, 0:14, 14:28])
    # Row 2 is patch row 1, patch column 0 (still the first merge window).
    assert np.array_equal(p[2].reshape(3, 2, 14, 14)[:, 0], x[:, 14:28, 0:14])


@pytest.mark.parametrize("h, w, cfg", CASES)
@pytest.mark.parametrize("kind", ["noise", "ui"])
def test_single_image_equals_transformers(h, w, cfg, kind, tmp_path):
    proc = _hf_processor(cfg, tmp_path)
    a = _noise(h, w) if kind == "noise" else _ui_screenshot(h, w)
    ref = proc(images=[Image.fromarray(a)], return_tensors="np")
    mine = preprocess_images([Image.fromarray(a)], cfg)
    assert mine.pixel_values_NxD.dtype == np.float32
    assert np.array_equal(mine.image_grid_thw_Ix3, ref["image_grid_thw"])
    assert np.array_equal(mine.pixel_values_NxD, ref["pixel_values"])


def test_image_list_equals_transformers(tmp_path):
    proc = _hf_processor(UI_TARS, tmp_path)
    images = [Image.fromarray(_noise(h, w, seed=i)) for i, (h, w) in
              enumerate([(210, 160), (57, 913), (210, 160), (300, 400), (28, 28)])]
    ref = proc(images=images, return_tensors="np")
    mine = preprocess_images(images, UI_TARS)
    assert np.array_equal(mine.image_grid_thw_Ix3, ref["image_grid_thw"])
    assert np.array_equal(mine.pixel_values_NxD, ref["pixel_values"])


def test_config_round_trips_through_transformers(tmp_path):
    proc = _hf_processor(UI_TARS, tmp_path)
    assert proc.size["shortest_edge"] == UI_TARS.min_pixels
    assert proc.size["longest_edge"] == UI_TARS.max_pixels
    assert ImageProcessorConfig.from_pretrained(tmp_path) == UI_TARS


def test_config_reads_size_dict_and_rejects_other_resampling():
    cfg = ImageProcessorConfig.from_dict({"size": {"shortest_edge": 3136, "longest_edge": 12845056}})
    assert (cfg.min_pixels, cfg.max_pixels) == (3136, 12845056)
    cfg = ImageProcessorConfig.from_dict({"size": {"shortest_edge": 1, "longest_edge": 2}, "min_pixels": 5,
                                          "max_pixels": 6})
    assert (cfg.min_pixels, cfg.max_pixels) == (5, 6)
    with pytest.raises(ValueError, match="bicubic"):
        ImageProcessorConfig.from_dict({"resample": 2})


def test_to_rgb_array_composites_alpha_on_white_like_vllm():
    rgba = np.zeros((4, 4, 4), np.uint8)
    rgba[..., 0] = 200
    rgba[:2, :, 3] = 255  # top half opaque red, bottom half fully transparent
    rgb = to_rgb_array(Image.fromarray(rgba, "RGBA"))
    assert rgb.shape == (4, 4, 3) and rgb.dtype == np.uint8
    assert (rgb[:2] == [200, 0, 0]).all() and (rgb[2:] == 255).all()
    assert np.array_equal(to_rgb_array(Image.fromarray(rgba[..., 0], "L")), np.repeat(rgba[..., :1], 3, -1))
    with pytest.raises(ValueError, match="HxWx3 uint8"):
        to_rgb_array(np.zeros((4, 4), np.uint8))


def test_module_imports_no_torch_or_jax():
    code = ("import sys, dart_jax.agent.image_processing; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'jax', 'transformers'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
