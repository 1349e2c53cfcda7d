"""Qwen2.5-VL architecture config: a frozen dataclass read from and written to config.json.

`Qwen25VLConfig.from_hf(d)` accepts both layouts seen in the wild:
- the transformers 5.x layout (`text_config` and `vision_config` sub-dicts, `rope_parameters`);
- the original Qwen2.5-VL / UI-TARS layout (text fields flat at the top level, `rope_scaling`
  with `mrope_section`, `in_chans` in the vision config).
`to_hf()` writes the transformers 5.x layout (what `save_pretrained` writes), which transformers
and vLLM both read.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

ARCHITECTURE = "Qwen2_5_VLForConditionalGeneration"


@dataclass(frozen=True)
class TextConfig:
    vocab_size: int = 152064
    hidden_size: int = 3584
    intermediate_size: int = 18944
    num_hidden_layers: int = 28
    num_attention_heads: int = 28
    num_key_value_heads: int = 4
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1000000.0
    mrope_section: tuple[int, ...] = (16, 24, 24)
    max_position_embeddings: int = 128000
    hidden_act: str = "silu"
    bos_token_id: int | None = 151643
    eos_token_id: int | tuple[int, ...] | None = 151645
    pad_token_id: int | None = None

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def validate(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"text hidden_size {self.hidden_size} not divisible by {self.num_attention_heads} heads")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("text num_attention_heads must be a multiple of num_key_value_heads")
        if 2 * sum(self.mrope_section) != self.head_dim:
            raise ValueError(f"mrope_section {self.mrope_section} must sum to head_dim/2 = {self.head_dim // 2}")
        if self.hidden_act != "silu":
            raise ValueError(f"text hidden_act {self.hidden_act!r} unsupported (only 'silu')")


@dataclass(frozen=True)
class VisionConfig:
    depth: int = 32
    hidden_size: int = 1280
    intermediate_size: int = 3420
    num_heads: int = 16
    in_channels: int = 3
    patch_size: int = 14
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    window_size: int = 112
    out_hidden_size: int = 3584
    fullatt_block_indexes: tuple[int, ...] = (7, 15, 23, 31)
    tokens_per_second: int = 2
    hidden_act: str = "silu"
    rope_theta: float = 10000.0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_dim(self) -> int:
        """Length of one flattened patch row of `pixel_values` (C * t * p * p)."""
        return self.in_channels * self.temporal_patch_size * self.patch_size**2

    @property
    def merge_unit(self) -> int:
        return self.spatial_merge_size**2

    @property
    def window_merged(self) -> int:
        """Side of an attention window in merged tokens (4 for 112 px windows of 14 px patches)."""
        return self.window_size // self.spatial_merge_size // self.patch_size

    @property
    def window_patches(self) -> int:
        """Patches in one full window: the slot size of the padded window layout."""
        return self.window_merged**2 * self.merge_unit

    def validate(self) -> None:
        if self.hidden_size % self.num_heads or self.head_dim % 4:
            raise ValueError("vision hidden_size/num_heads must be a multiple of 4 (2D rotary)")
        if self.window_merged < 1:
            raise ValueError(f"vision window_size {self.window_size} smaller than one merged patch")
        if any(not 0 <= i < self.depth for i in self.fullatt_block_indexes):
            raise ValueError(f"fullatt_block_indexes {self.fullatt_block_indexes} outside depth {self.depth}")
        if self.hidden_act != "silu":
            raise ValueError(f"vision hidden_act {self.hidden_act!r} unsupported (only 'silu')")


@dataclass(frozen=True)
class Qwen25VLConfig:
    text: TextConfig = field(default_factory=TextConfig)
    vision: VisionConfig = field(default_factory=VisionConfig)
    tie_word_embeddings: bool = False
    image_token_id: int = 151655
    video_token_id: int = 151656
    vision_start_token_id: int = 151652
    vision_end_token_id: int = 151653

    def __post_init__(self):
        self.text.validate()
        self.vision.validate()
        if self.vision.out_hidden_size != self.text.hidden_size:
            raise ValueError(
                f"vision out_hidden_size {self.vision.out_hidden_size} != text hidden_size {self.text.hidden_size}"
            )

    @classmethod
    def from_hf(cls, d: dict[str, Any]) -> Qwen25VLConfig:
        model_type = d.get("model_type", "qwen2_5_vl")
        if model_type != "qwen2_5_vl":
            raise ValueError(f"config.json model_type {model_type!r} is not 'qwen2_5_vl'")
        text_d = d.get("text_config") or d  # original checkpoints keep text fields flat
        text = _text_from_hf(text_d, d)
        vision = _vision_from_hf(d.get("vision_config") or {})
        tie = d.get("tie_word_embeddings", text_d.get("tie_word_embeddings", False))
        top = {k: d[k] for k in _TOKEN_FIELDS if d.get(k) is not None}
        return cls(text=text, vision=vision, tie_word_embeddings=bool(tie), **top)

    def to_hf(self) -> dict[str, Any]:
        t, v = self.text, self.vision
        text_config = {
            "model_type": "qwen2_5_vl_text",
            **{f.name: getattr(t, f.name) for f in dataclasses.fields(t) if f.name not in ("rope_theta", "mrope_section")},
            "rope_parameters": {"rope_type": "default", "rope_theta": t.rope_theta, "mrope_section": list(t.mrope_section)},
            "use_sliding_window": False,
            "sliding_window": None,
            "attention_dropout": 0.0,
            "layer_types": ["full_attention"] * t.num_hidden_layers,
        }
        if isinstance(t.eos_token_id, tuple):
            text_config["eos_token_id"] = list(t.eos_token_id)
        vision_config = {
            "model_type": "qwen2_5_vl_vision",
            **{f.name: getattr(v, f.name) for f in dataclasses.fields(v) if f.name != "rope_theta"},
            "fullatt_block_indexes": list(v.fullatt_block_indexes),
            "rope_parameters": {"rope_type": "axial", "rope_theta": v.rope_theta},
        }
        return {
            "architectures": [ARCHITECTURE],
            "model_type": "qwen2_5_vl",
            "text_config": text_config,
            "vision_config": vision_config,
            "tie_word_embeddings": self.tie_word_embeddings,
            **{k: getattr(self, k) for k in _TOKEN_FIELDS},
        }


_TOKEN_FIELDS = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")


def _rope(d: dict[str, Any]) -> dict[str, Any]:
    return d.get("rope_parameters") or d.get("rope_scaling") or {}


def _text_from_hf(d: dict[str, Any], top: dict[str, Any]) -> TextConfig:
    if d.get("use_sliding_window"):
        raise ValueError("use_sliding_window=true is not supported (Qwen2.5-VL checkpoints do not use it)")
    rope = _rope(d) or _rope(top)
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ("default", "mrope"):
        raise ValueError(f"text rope type {rope_type!r} unsupported (only default/mrope)")
    kwargs = _known(TextConfig, d)
    kwargs["rope_theta"] = float(rope.get("rope_theta", d.get("rope_theta", top.get("rope_theta", 1000000.0))))
    if "mrope_section" in rope:
        kwargs["mrope_section"] = tuple(rope["mrope_section"])
    if isinstance(kwargs.get("eos_token_id"), list):
        kwargs["eos_token_id"] = tuple(kwargs["eos_token_id"])
    if kwargs.get("num_key_value_heads") is None:
        kwargs["num_key_value_heads"] = kwargs.get("num_attention_heads", TextConfig.num_attention_heads)
    return TextConfig(**kwargs)


def _vision_from_hf(d: dict[str, Any]) -> VisionConfig:
    kwargs = _known(VisionConfig, d)
    if "in_chans" in d and "in_channels" not in d:
        kwargs["in_channels"] = d["in_chans"]
    if "fullatt_block_indexes" in kwargs:
        kwargs["fullatt_block_indexes"] = tuple(kwargs["fullatt_block_indexes"])
    rope = _rope(d)
    if "rope_theta" in rope:
        kwargs["rope_theta"] = float(rope["rope_theta"])
    for name in ("patch_size", "temporal_patch_size"):
        if isinstance(kwargs.get(name), (list, tuple)):
            raise ValueError(f"vision {name}={kwargs[name]} as a list is unsupported")
    return VisionConfig(**kwargs)


def _known(cls, d: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)} - {"rope_theta", "mrope_section"}
    return {k: d[k] for k in names if k in d}
