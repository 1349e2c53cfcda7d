"""Tiny random Qwen2.5-VL checkpoints built with transformers, and its logits as the reference."""

from __future__ import annotations

import numpy as np

IMAGE, VIDEO, V_START, V_END = 250, 251, 252, 253
VOCAB = 256
INIT = 0.1  # larger than the default 0.02 so logits are O(1-10) and attention is far from uniform

# (name, text overrides, vision overrides, tie): depths, window sizes and full-attention sets differ.
CONFIGS = {
    "a": (dict(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, hidden_size=64, intermediate_size=96),
          dict(depth=3, hidden_size=32, num_heads=2, intermediate_size=48, window_size=56, fullatt_block_indexes=[1]),
          False),
    "b": (dict(num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=1, hidden_size=64, intermediate_size=80),
          dict(depth=4, hidden_size=48, num_heads=3, intermediate_size=64, window_size=112, fullatt_block_indexes=[0, 3]),
          True),
    "c": (dict(num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2, hidden_size=32, intermediate_size=64),
          dict(depth=2, hidden_size=32, num_heads=4, intermediate_size=40, window_size=28, fullatt_block_indexes=[]),
          False),
}


def hf_config(name: str):
    from transformers import Qwen2_5_VLConfig

    text, vision, tie = CONFIGS[name]
    head_dim = text["hidden_size"] // text["num_attention_heads"]
    quarter = head_dim // 2 // 4
    section = [head_dim // 2 - 2 * ((head_dim // 2 - quarter) // 2)] + [(head_dim // 2 - quarter) // 2] * 2
    text = dict(text, vocab_size=VOCAB, rms_norm_eps=1e-6, initializer_range=INIT, bos_token_id=0, eos_token_id=1, pad_token_id=0,
                rope_parameters=dict(rope_type="default", rope_theta=10000.0, mrope_section=section))
    vision = dict(vision, out_hidden_size=text["hidden_size"], initializer_range=INIT)
    return Qwen2_5_VLConfig(text_config=text, vision_config=vision, image_token_id=IMAGE, video_token_id=VIDEO,
                            vision_start_token_id=V_START, vision_end_token_id=V_END, tie_word_embeddings=tie)


def build(name: str, out_dir, seed: int = 0):
    """Save a random fp32 model with eager attention to out_dir; returns the torch model."""
    import torch
    from transformers import Qwen2_5_VLForConditionalGeneration

    torch.manual_seed(seed)
    cfg = hf_config(name)
    cfg._attn_implementation = "eager"
    model = Qwen2_5_VLForConditionalGeneration(cfg).eval()
    with torch.no_grad():  # non-trivial norms and biases so a swapped tensor cannot hide
        for n, p in model.named_parameters():
            if n.endswith("bias") or "norm" in n or "ln_q" in n:
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(out_dir)
    return model


def images(sizes, seed=0):
    """Processor outputs (pixel_values, image_grid_thw) for random RGB images of (H, W) sizes."""
    from PIL import Image
    from transformers import Qwen2VLImageProcessor

    rng = np.random.default_rng(seed)
    imgs = [Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)) for h, w in sizes]
    proc = Qwen2VLImageProcessor(min_pixels=28 * 28, max_pixels=200 * 28 * 28)
    out = proc(images=imgs, return_tensors="np")
    return np.asarray(out["pixel_values"], np.float32), np.asarray(out["image_grid_thw"], np.int64)


def image_tokens(grid, merge=2):
    t, h, w = grid
    return [V_START] + [IMAGE] * (t * h * w // merge**2) + [V_END]


def batch(rows, pad="left"):
    """Pad token-id lists into (input_ids, attention_mask)."""
    t = max(len(r) for r in rows)
    ids = np.zeros((len(rows), t), np.int64)
    mask = np.zeros((len(rows), t), np.int64)
    for i, r in enumerate(rows):
        sl = slice(t - len(r), t) if pad == "left" else slice(0, len(r))
        ids[i, sl], mask[i, sl] = r, 1
    return ids, mask


def hf_logits(model, input_ids, attention_mask=None, pixel_values=None, image_grid_thw=None):
    import torch

    kw = dict(input_ids=torch.as_tensor(input_ids))
    if attention_mask is not None:
        kw["attention_mask"] = torch.as_tensor(attention_mask)
    if pixel_values is not None:
        kw["pixel_values"] = torch.as_tensor(pixel_values)
        kw["image_grid_thw"] = torch.as_tensor(image_grid_thw)
        kw["mm_token_type_ids"] = torch.as_tensor((np.asarray(input_ids) == IMAGE).astype(np.int64))
    with torch.no_grad():
        return model(**kw).logits.float().numpy()
