"""Qwen2-VL / Qwen2.5-VL image preprocessing in numpy, bit-exact with what vLLM feeds the model.

vLLM builds pixel values with transformers' `Qwen2VLImageProcessor`, which in transformers 5.x
is the torchvision backend: uint8 CHW tensor -> `tvF.resize(bicubic, antialias=True)` -> fused
rescale+normalize in float32 -> patchify. On CPU the uint8 bicubic resize runs torch's own
separable integer kernel (not PIL's: the two differ by up to a few levels on busy images), so
`resize_bicubic_u8` ports that kernel (aten/src/ATen/native/cpu/UpSampleKernel.cpp:
`_compute_index_ranges_int16_weights` + `basic_loop_aa_{horizontal,vertical}<uint8_t>`):
double-precision Keys cubic (a = -0.5) weights, normalized, quantized to int16 with a
per-axis precision, integer accumulation, horizontal pass first, uint8 in between.

No torch import: rollout workers and the trainer's data path use this with numpy and PIL.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence, Union

import numpy as np
from PIL import Image, ImageOps

# transformers' OPENAI_CLIP_MEAN / OPENAI_CLIP_STD (image_utils.py).
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
PIL_BICUBIC = 3  # PILImageResampling.BICUBIC, the value preprocessor_config.json stores

ImageLike = Union[Image.Image, np.ndarray]


def smart_resize(height: int, width: int, factor: int = 28, min_pixels: int = 56 * 56,
                 max_pixels: int = 14 * 14 * 4 * 1280) -> tuple[int, int]:
    """(H', W'): multiples of `factor`, H'*W' within [min_pixels, max_pixels], aspect kept.

    Same arithmetic as transformers' `smart_resize` (Python's round-half-even included).
    UI-TARS coordinates are absolute pixels in this (H', W') image.
    """
    if min(height, width) <= 0:
        raise ValueError(f"image size must be positive, got {height}x{width}")
    if max(height, width) / min(height, width) > 200:
        raise ValueError(
            f"absolute aspect ratio must be smaller than 200, got {max(height, width) / min(height, width)}")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


@dataclass(frozen=True)
class ImageProcessorConfig:
    """The fields of a Qwen2-VL preprocessor_config.json that shape the pixel values."""

    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    image_mean: tuple[float, ...] = CLIP_MEAN
    image_std: tuple[float, ...] = CLIP_STD
    rescale_factor: float = 1 / 255
    do_resize: bool = True
    do_rescale: bool = True
    do_normalize: bool = True

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    @classmethod
    def from_dict(cls, d: dict) -> "ImageProcessorConfig":
        """Read a preprocessor_config.json dict the way transformers' __init__ does.

        `min_pixels` / `max_pixels` override `size.shortest_edge` / `size.longest_edge`.
        """
        size = dict(d.get("size") or {})
        min_pixels = d.get("min_pixels", size.get("shortest_edge", cls.min_pixels))
        max_pixels = d.get("max_pixels", size.get("longest_edge", cls.max_pixels))
        resample = d.get("resample", PIL_BICUBIC)
        if resample != PIL_BICUBIC:
            raise ValueError(f"only bicubic resampling (resample=3) is supported, got resample={resample}")
        if d.get("do_center_crop") or d.get("do_pad"):
            raise ValueError("do_center_crop / do_pad are not part of the Qwen2-VL pipeline")
        if not d.get("do_convert_rgb", True):
            raise ValueError("do_convert_rgb=false is not supported (vLLM converts to RGB anyway)")
        fields = dict(min_pixels=int(min_pixels), max_pixels=int(max_pixels))
        for key in ("patch_size", "temporal_patch_size", "merge_size", "rescale_factor",
                    "do_resize", "do_rescale", "do_normalize"):
            if key in d:
                fields[key] = d[key]
        for key in ("image_mean", "image_std"):
            if key in d:
                fields[key] = tuple(float(v) for v in d[key])
        return cls(**fields)

    @classmethod
    def from_pretrained(cls, model_dir: str | Path) -> "ImageProcessorConfig":
        path = Path(model_dir) / "preprocessor_config.json"
        return cls.from_dict(json.loads(path.read_text()))

    def to_dict(self) -> dict:
        """The preprocessor_config.json content transformers reads back to this config."""
        return {
            "image_processor_type": "Qwen2VLImageProcessor",
            "processor_class": "Qwen2_5_VLProcessor",
            "min_pixels": self.min_pixels,
            "max_pixels": self.max_pixels,
            "size": {"shortest_edge": self.min_pixels, "longest_edge": self.max_pixels},
            "patch_size": self.patch_size,
            "temporal_patch_size": self.temporal_patch_size,
            "merge_size": self.merge_size,
            "image_mean": list(self.image_mean),
            "image_std": list(self.image_std),
            "rescale_factor": self.rescale_factor,
            "resample": PIL_BICUBIC,
            "do_resize": self.do_resize,
            "do_rescale": self.do_rescale,
            "do_normalize": self.do_normalize,
            "do_convert_rgb": True,
        }

    def resized_hw(self, height: int, width: int) -> tuple[int, int]:
        if not self.do_resize:
            return height, width
        return smart_resize(height, width, self.factor, self.min_pixels, self.max_pixels)

    def grid_thw(self, height: int, width: int) -> tuple[int, int, int]:
        """(t, h, w) patch grid of one image of this size (t = 1 for a still image)."""
        h, w = self.resized_hw(height, width)
        if h % self.factor or w % self.factor:
            raise ValueError(f"{h}x{w} is not a multiple of patch_size*merge_size={self.factor}")
        return 1, h // self.patch_size, w // self.patch_size

    def num_image_tokens(self, height: int, width: int) -> int:
        """How many <|image_pad|> tokens one image of this size expands to."""
        t, h, w = self.grid_thw(height, width)
        return t * h * w // self.merge_size**2


@dataclass(frozen=True)
class ProcessedImages:
    pixel_values_NxD: np.ndarray  # float32 [sum of patches, C*T*P*P]
    image_grid_thw_Ix3: np.ndarray  # int64 [images, 3]


def to_rgb_array(image: ImageLike) -> np.ndarray:
    """uint8 [H, W, 3] as vLLM hands it to the processor.

    PIL: EXIF orientation applied, transparency composited over white (vLLM's
    `convert_image_mode`), other modes `.convert("RGB")`. Arrays must already be HxWx3 uint8.
    Send RGB screenshots to vLLM and all of this is the identity.
    """
    if isinstance(image, np.ndarray):
        if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
            raise ValueError(f"expected an HxWx3 uint8 array, got {image.dtype} {image.shape}")
        return image
    if not isinstance(image, Image.Image):
        raise TypeError(f"expected a PIL image or a numpy array, got {type(image).__name__}")
    try:
        image = ImageOps.exif_transpose(image)
    except Exception:  # vLLM suppresses EXIF errors too
        pass
    if image.mode != "RGB":
        if image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info:
            rgba = image.convert("RGBA")
            rgb = Image.new("RGB", rgba.size, (255, 255, 255))
            rgb.paste(rgba, mask=rgba.split()[3])
            image = rgb
        else:
            image = image.convert("RGB")
    return np.asarray(image, dtype=np.uint8)


def _keys_cubic(x: np.ndarray) -> np.ndarray:
    """Keys cubic kernel, a = -0.5 (torch's aa_filter<double, true>), in float64."""
    a = -0.5
    x = np.abs(x)
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return np.where(x < 1.0, near, np.where(x < 2.0, far, 0.0))


def _int16_taps(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Source indices [out, K], int weights [out, K] and precision for one axis."""
    scale = in_size / out_size
    support = 2.0 * scale if scale >= 1.0 else 2.0
    ksize = int(math.ceil(support)) * 2 + 1
    invscale = 1.0 / scale if scale >= 1.0 else 1.0
    center = scale * (np.arange(out_size, dtype=np.float64) + 0.5)
    xmin = np.maximum((center - support + 0.5).astype(np.int64), 0)  # C++ cast truncates
    xsize = np.minimum((center + support + 0.5).astype(np.int64), in_size) - xmin
    xsize = np.clip(xsize, 0, ksize)
    j = np.arange(ksize)
    valid = j[None, :] < xsize[:, None]
    w = np.where(valid, _keys_cubic(((j[None, :] + xmin[:, None]) - center[:, None] + 0.5) * invscale), 0.0)
    total = np.zeros(out_size)
    for k in range(ksize):  # sequential sum, as the C++ loop
        total = total + w[:, k]
    nonzero = total != 0.0
    w = np.where(nonzero[:, None], w / np.where(nonzero, total, 1.0)[:, None], w)
    wt_max = float(np.max(np.where(valid & nonzero[:, None], w, 0.0), initial=0.0))
    precision = 0
    while precision < 22 and int(0.5 + wt_max * (1 << (precision + 1))) < (1 << 15):
        precision += 1
    v = w * (1 << precision)
    wi = np.where(v < 0, np.trunc(-0.5 + v), np.trunc(0.5 + v)).astype(np.int32)
    idx = np.minimum(xmin[:, None] + j[None, :], in_size - 1)
    return idx, np.where(valid, wi, 0), precision


def _resample_rows(img: np.ndarray, out_size: int) -> np.ndarray:
    """One separable pass along axis 0 (gathers whole rows: contiguous, fast in numpy)."""
    idx, w, precision = _int16_taps(img.shape[0], out_size)
    w_shape = (out_size,) + (1,) * (img.ndim - 1)
    acc = np.full((out_size,) + img.shape[1:], 1 << (precision - 1), np.int32)
    tmp = np.empty_like(acc)
    for k in range(idx.shape[1]):
        np.multiply(img[idx[:, k]], w[:, k].reshape(w_shape), out=tmp, dtype=np.int32)
        acc += tmp
    np.right_shift(acc, precision, out=acc)
    return np.clip(acc, 0, 255).astype(np.uint8)


def resize_bicubic_u8(image_HxWxC: np.ndarray, height: int, width: int) -> np.ndarray:
    """torch's `interpolate(uint8, mode="bicubic", antialias=True, align_corners=False)` on CPU.

    Horizontal pass first (on the transposed image), then vertical, uint8 in between, as torch.
    """
    if image_HxWxC.dtype != np.uint8:
        raise ValueError(f"expected uint8, got {image_HxWxC.dtype}")
    out = image_HxWxC
    if out.shape[1] != width:
        cols = _resample_rows(np.ascontiguousarray(out.transpose(1, 0, 2)), width)
        out = np.ascontiguousarray(cols.transpose(1, 0, 2))
    if out.shape[0] != height:
        out = _resample_rows(out, height)
    return out


def normalize(image_HxWxC: np.ndarray, cfg: ImageProcessorConfig) -> np.ndarray:
    """float32 [C, H, W], with the float32 op order of the fused torchvision path.

    transformers folds rescaling into normalization: mean/std are float32 tensors scaled by
    1/rescale_factor, then (x - mean') / std'.
    """
    x = np.ascontiguousarray(image_HxWxC.transpose(2, 0, 1)).astype(np.float32)
    if cfg.do_normalize:
        if cfg.do_rescale:
            inv = np.float32(1.0 / cfg.rescale_factor)
            mean = np.asarray(cfg.image_mean, np.float32) * inv
            std = np.asarray(cfg.image_std, np.float32) * inv
        else:
            mean = np.asarray(cfg.image_mean, np.float32)
            std = np.asarray(cfg.image_std, np.float32)
        return (x - mean[:, None, None]) / std[:, None, None]
    if cfg.do_rescale:
        return x * np.float32(cfg.rescale_factor)
    return x


def patchify(image_CxHxW: np.ndarray, cfg: ImageProcessorConfig) -> np.ndarray:
    """[grid_h*grid_w, C*T*P*P] in transformers' order: merge windows first, frames duplicated."""
    c, h, w = image_CxHxW.shape
    p, m, t = cfg.patch_size, cfg.merge_size, cfg.temporal_patch_size
    gh, gw = h // p, w // p
    x = image_CxHxW.reshape(c, gh // m, m, p, gw // m, m, p)
    x = x.transpose(1, 4, 2, 5, 0, 3, 6)  # [gh/m, gw/m, m, m, C, P, P]
    x = np.broadcast_to(x[:, :, :, :, :, None], x.shape[:5] + (t,) + x.shape[5:])
    return x.reshape(gh * gw, c * t * p * p)


def preprocess_image(image: ImageLike, cfg: ImageProcessorConfig) -> tuple[np.ndarray, tuple[int, int, int]]:
    """One image -> (pixel_values [patches, D] float32, (t, h, w) grid)."""
    rgb = to_rgb_array(image)
    h, w = cfg.resized_hw(rgb.shape[0], rgb.shape[1])
    resized = resize_bicubic_u8(rgb, h, w)
    grid = cfg.grid_thw(rgb.shape[0], rgb.shape[1])
    return patchify(normalize(resized, cfg), cfg), grid


def preprocess_images(images: Sequence[ImageLike], cfg: ImageProcessorConfig) -> ProcessedImages:
    """Images in prompt order -> the processor's `pixel_values` and `image_grid_thw`."""
    if not images:
        raise ValueError("preprocess_images needs at least one image")
    patches, grids = zip(*(preprocess_image(im, cfg) for im in images))
    return ProcessedImages(np.concatenate(patches, axis=0), np.asarray(grids, dtype=np.int64))
