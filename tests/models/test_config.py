"""config.json in both layouts (original Qwen2.5-VL / UI-TARS, transformers 5.x) and back."""

import pytest

from dart_jax.models.config import Qwen25VLConfig
from tests.models import hf_reference as R

# The layout of Qwen2.5-VL-7B-Instruct / UI-TARS-1.5-7B config.json (text fields flat, rope_scaling).
ORIGINAL_7B = {
    "architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl",
    "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151645, "hidden_act": "silu",
    "hidden_size": 3584, "intermediate_size": 18944, "max_position_embeddings": 128000,
    "max_window_layers": 28, "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "use_cache": True, "use_sliding_window": False, "vocab_size": 152064,
    "vision_start_token_id": 151652, "vision_end_token_id": 151653, "vision_token_id": 151654,
    "image_token_id": 151655, "video_token_id": 151656,
    "vision_config": {"depth": 32, "hidden_act": "silu", "hidden_size": 1280, "intermediate_size": 3420,
                      "num_heads": 16, "in_chans": 3, "out_hidden_size": 3584, "patch_size": 14,
                      "spatial_merge_size": 2, "spatial_patch_size": 14, "window_size": 112,
                      "fullatt_block_indexes": [7, 15, 23, 31], "tokens_per_second": 2, "temporal_patch_size": 2},
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
}


def test_original_layout():
    cfg = Qwen25VLConfig.from_hf(ORIGINAL_7B)
    assert cfg.text.hidden_size == 3584 and cfg.text.num_key_value_heads == 4 and cfg.text.vocab_size == 152064
    assert cfg.text.mrope_section == (16, 24, 24) and cfg.text.rope_theta == 1e6 and cfg.text.rms_norm_eps == 1e-6
    assert cfg.vision.fullatt_block_indexes == (7, 15, 23, 31) and cfg.vision.in_channels == 3
    assert cfg.vision.window_patches == 64 and cfg.image_token_id == 151655 and not cfg.tie_word_embeddings
    assert Qwen25VLConfig.from_hf(cfg.to_hf()) == cfg


def test_to_hf_is_read_by_transformers():
    from transformers import Qwen2_5_VLConfig

    cfg = Qwen25VLConfig.from_hf(ORIGINAL_7B)
    hf = Qwen2_5_VLConfig(**cfg.to_hf())
    assert hf.text_config.hidden_size == 3584 and hf.text_config.num_key_value_heads == 4
    assert hf.text_config.rope_parameters["mrope_section"] == [16, 24, 24]
    assert hf.vision_config.fullatt_block_indexes == [7, 15, 23, 31] and hf.vision_config.window_size == 112
    assert Qwen25VLConfig.from_hf(hf.to_dict()) == cfg


@pytest.mark.parametrize("name", sorted(R.CONFIGS))
def test_transformers5_layout(name):
    hf = R.hf_config(name)
    cfg = Qwen25VLConfig.from_hf(hf.to_dict())
    assert cfg.tie_word_embeddings == hf.tie_word_embeddings
    assert list(cfg.vision.fullatt_block_indexes) == list(hf.vision_config.fullatt_block_indexes)
    assert list(cfg.text.mrope_section) == hf.text_config.rope_parameters["mrope_section"]
    assert Qwen25VLConfig.from_hf(cfg.to_hf()) == cfg


@pytest.mark.parametrize("edit, message", [
    ({"model_type": "qwen2_vl"}, "model_type 'qwen2_vl'"),
    ({"use_sliding_window": True}, "use_sliding_window"),
    ({"rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 16]}}, "mrope_section"),
    ({"vision_config": {**ORIGINAL_7B["vision_config"], "fullatt_block_indexes": [40]}}, "outside depth"),
])
def test_bad_configs_are_named(edit, message):
    with pytest.raises(ValueError, match=message):
        Qwen25VLConfig.from_hf({**ORIGINAL_7B, **edit})
