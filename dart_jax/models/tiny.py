"""A tiny Qwen2.5-VL-shaped Hugging Face directory, built offline.

`make_tiny_hf_dir(out)` writes what a real checkpoint directory holds (config.json,
model.safetensors with the Hub tensor names UI-TARS-1.5-7B uses, tokenizer.json +
tokenizer_config.json + chat_template.jinja, preprocessor_config.json,
generation_config.json), so transformers, vLLM and our Flax loader all read it the way they
read UI-TARS. Weights come from numpy (no torch), the tokenizer is a byte-level BPE trained
with `tokenizers` on a small built-in corpus of GUI-agent text, with every Qwen2.5-VL
special token appended after the learned vocabulary.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file
from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors,
                        trainers)

from dart_jax.agent.image_processing import ImageProcessorConfig
from dart_jax.agent.prompt import COMPUTER_USE_PROMPT  # the one copy of the action space

# Qwen2.5-VL's special tokens, in Qwen's id order (151643 ... 151656 in the real vocabulary).
SPECIAL_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
)

# Qwen2's pre-tokenizer split (contractions, letters, single digits, punctuation runs, spaces).
QWEN2_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Same rendering as Qwen2.5-VL's template: ChatML turns, a default system turn, images as
# <|vision_start|><|image_pad|><|vision_end|> (the processor expands <|image_pad|> later).
# No whitespace control: the template has no layout whitespace, only the newlines it emits.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' or 'image' in part or 'image_url' in part %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'video' or 'video' in part %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in part %}{{ part['text'] }}"
    "{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass(frozen=True)
class TinySpec:
    """Sizes of the tiny policy. Text head_dim 64 (vLLM's CPU attention supports it)."""

    text_hidden: int = 128
    text_layers: int = 2
    text_heads: int = 2
    text_kv_heads: int = 1
    text_intermediate: int = 256
    mrope_section: tuple[int, ...] = (8, 12, 12)  # sums to text head_dim / 2
    rope_theta: float = 1000000.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 32768
    vision_hidden: int = 64
    vision_depth: int = 4
    vision_heads: int = 2
    vision_intermediate: int = 128
    fullatt_block_indexes: tuple[int, ...] = (1, 3)
    window_size: int = 112
    tokens_per_second: int = 2
    bpe_vocab: int = 2048  # target size of the learned vocabulary (before special tokens)
    min_pixels: int = 100 * 28 * 28  # UI-TARS-1.5's smart_resize bounds
    max_pixels: int = 16384 * 28 * 28
    init_std: float = 0.02

    def validate(self) -> None:
        head_dim, rem = divmod(self.text_hidden, self.text_heads)
        if rem or self.text_heads % self.text_kv_heads:
            raise ValueError("text_hidden must divide into text_heads, text_heads into text_kv_heads")
        if 2 * sum(self.mrope_section) != head_dim:
            raise ValueError(f"mrope_section {self.mrope_section} must sum to head_dim/2 = {head_dim // 2}")
        if self.vision_hidden % self.vision_heads or (self.vision_hidden // self.vision_heads) % 4:
            raise ValueError("vision head_dim must be a multiple of 4 (2D rotary)")
        if any(not 0 <= i < self.vision_depth for i in self.fullatt_block_indexes):
            raise ValueError("fullatt_block_indexes must index vision blocks")


EVERYDAY_WORDS = (
    "apple", "river", "cloud", "tiger", "maple", "stone", "piano", "ocean", "lemon", "ember",
    "frost", "orbit", "cedar", "pearl", "delta", "quartz", "nova", "sable", "tulip", "zephyr",
    "name", "city", "email", "code", "phone", "address", "country", "password", "user", "search",
    "submit", "cancel", "save", "delete", "edit", "open", "close", "next", "back", "done",
    "red", "green", "blue", "yellow", "purple", "orange", "black", "white", "gray", "pink",
    "basic", "pro", "team", "enterprise", "free", "home", "file", "view", "help", "settings",
    "paris", "london", "berlin", "tokyo", "madrid", "rome", "boston", "denver", "austin", "seattle",
    "monday", "friday", "today", "morning", "evening", "january", "june", "march", "summer", "winter",
    "alice", "bob", "carol", "david", "emma", "frank", "grace", "henry", "iris", "jack",
    "book", "chair", "table", "window", "garden", "forest", "mountain", "island", "bridge", "castle",
    "coffee", "bread", "cheese", "honey", "sugar", "water", "paper", "pencil", "camera", "guitar",
)


def _corpus() -> list[str]:
    """GUI-agent text the BPE is trained on: instructions, thoughts, actions, UI words."""
    widgets = ["button", "link", "checkbox", "text box", "dropdown", "menu", "tab", "slider",
               "search bar", "icon", "dialog", "input field", "radio button", "scroll bar"]
    verbs = ["Click", "Select", "Type", "Enter", "Drag", "Scroll", "Open", "Close", "Find", "Submit"]
    lines = [COMPUTER_USE_PROMPT]
    for i, w in enumerate(widgets):
        for j, v in enumerate(verbs):
            x, y = (37 * i + 11 * j) % 1000, (53 * j + 7 * i) % 1000
            lines.append(f"{v} the {w} labelled \"Item {i + j}\" and then press OK.")
            lines.append(f"Thought: I need to {v.lower()} the {w} near the top of the page.\n"
                         f"Action: click(start_box='<|box_start|>({x},{y})<|box_end|>')")
            lines.append(f"Action: type(content='hello world {i}\\n')\nAction: scroll(start_box='({y},{x})', "
                         f"direction='down')\nAction: hotkey(key='ctrl c')\nAction: finished(content='done')")
    lines += ["The quick brown fox jumps over the lazy dog. 0123456789 !?.,;:'\"()[]{}<>@#$%^&*-+=_/\\|~`"]
    # everyday words, lower-case and as UI labels, often enough that each becomes one token (a
    # real tokenizer has them whole; spelled letter by letter, copying a word the instruction
    # names into a type action is a per-letter lookup no tiny policy learns in minutes)
    for w in EVERYDAY_WORDS:
        lines += [f"Type \"{w}\" in the {w} field.", f"Label: \"{w.capitalize()}\". Value: {w}"] * 2
    return lines


def build_tokenizer(vocab_size: int = 2048):
    """Byte-level BPE (Qwen2's pre-tokenizer and decoder) plus the special tokens at the end."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tok.train_from_iterator(_corpus(), trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    return tok


def _token_ids(tok) -> dict[str, int]:
    return {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}


def hf_config(spec: TinySpec, ids: dict[str, int], vocab_size: int) -> dict:
    """config.json in the layout transformers 5.x `save_pretrained` writes."""
    text = {
        "model_type": "qwen2_5_vl_text", "vocab_size": vocab_size, "hidden_size": spec.text_hidden,
        "intermediate_size": spec.text_intermediate, "num_hidden_layers": spec.text_layers,
        "num_attention_heads": spec.text_heads, "num_key_value_heads": spec.text_kv_heads,
        "hidden_act": "silu", "rms_norm_eps": spec.rms_norm_eps,
        "max_position_embeddings": spec.max_position_embeddings, "attention_dropout": 0.0,
        "rope_parameters": {"rope_type": "default", "type": "mrope", "rope_theta": spec.rope_theta,
                            "mrope_section": list(spec.mrope_section)},
        "bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|endoftext|>"], "tie_word_embeddings": False, "use_cache": True,
        "use_sliding_window": False, "sliding_window": None, "initializer_range": spec.init_std,
    }
    vision = {
        "model_type": "qwen2_5_vl_vision", "depth": spec.vision_depth, "hidden_size": spec.vision_hidden,
        "intermediate_size": spec.vision_intermediate, "num_heads": spec.vision_heads,
        "out_hidden_size": spec.text_hidden, "hidden_act": "silu", "in_channels": 3,
        "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2,
        "window_size": spec.window_size, "fullatt_block_indexes": list(spec.fullatt_block_indexes),
        "tokens_per_second": spec.tokens_per_second, "initializer_range": spec.init_std,
    }
    return {
        "architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl",
        "dtype": "float32", "tie_word_embeddings": False, "text_config": text, "vision_config": vision,
        "image_token_id": ids["<|image_pad|>"], "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"], "vision_end_token_id": ids["<|vision_end|>"],
    }


def tensor_shapes(spec: TinySpec, vocab_size: int) -> dict[str, tuple[int, ...]]:
    """Every tensor of a Qwen2.5-VL checkpoint, Hub names (as UI-TARS-1.5-7B stores them)."""
    h, vh, vi = spec.text_hidden, spec.vision_hidden, spec.vision_intermediate
    hd = h // spec.text_heads
    q, kv, merged = spec.text_heads * hd, spec.text_kv_heads * hd, vh * 4
    shapes = {"visual.patch_embed.proj.weight": (vh, 3, 2, 14, 14)}
    for i in range(spec.vision_depth):
        b = f"visual.blocks.{i}"
        shapes.update({
            f"{b}.norm1.weight": (vh,), f"{b}.norm2.weight": (vh,),
            f"{b}.attn.qkv.weight": (3 * vh, vh), f"{b}.attn.qkv.bias": (3 * vh,),
            f"{b}.attn.proj.weight": (vh, vh), f"{b}.attn.proj.bias": (vh,),
            f"{b}.mlp.gate_proj.weight": (vi, vh), f"{b}.mlp.gate_proj.bias": (vi,),
            f"{b}.mlp.up_proj.weight": (vi, vh), f"{b}.mlp.up_proj.bias": (vi,),
            f"{b}.mlp.down_proj.weight": (vh, vi), f"{b}.mlp.down_proj.bias": (vh,),
        })
    shapes.update({
        "visual.merger.ln_q.weight": (vh,), "visual.merger.mlp.0.weight": (merged, merged),
        "visual.merger.mlp.0.bias": (merged,), "visual.merger.mlp.2.weight": (h, merged),
        "visual.merger.mlp.2.bias": (h,), "model.embed_tokens.weight": (vocab_size, h),
    })
    for i in range(spec.text_layers):
        b = f"model.layers.{i}"
        shapes.update({
            f"{b}.input_layernorm.weight": (h,), f"{b}.post_attention_layernorm.weight": (h,),
            f"{b}.self_attn.q_proj.weight": (q, h), f"{b}.self_attn.q_proj.bias": (q,),
            f"{b}.self_attn.k_proj.weight": (kv, h), f"{b}.self_attn.k_proj.bias": (kv,),
            f"{b}.self_attn.v_proj.weight": (kv, h), f"{b}.self_attn.v_proj.bias": (kv,),
            f"{b}.self_attn.o_proj.weight": (h, q),
            f"{b}.mlp.gate_proj.weight": (spec.text_intermediate, h),
            f"{b}.mlp.up_proj.weight": (spec.text_intermediate, h),
            f"{b}.mlp.down_proj.weight": (h, spec.text_intermediate),
        })
    shapes.update({"model.norm.weight": (h,), "lm_head.weight": (vocab_size, h)})
    return shapes


def random_weights(spec: TinySpec, vocab_size: int, seed: int) -> dict[str, np.ndarray]:
    """float32 weights. Norm scales and biases are random too (not 1 and 0), so a tensor that
    a converter drops or misplaces changes the outputs and parity tests catch it."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in tensor_shapes(spec, vocab_size).items():
        if name.endswith("norm.weight") or "layernorm" in name or ".norm1." in name or ".norm2." in name \
                or "ln_q" in name:
            w = 1.0 + 0.1 * rng.standard_normal(shape)
        else:
            w = spec.init_std * rng.standard_normal(shape)
        out[name] = w.astype(np.float32)
    return out


def _tokenizer_config(ids: dict[str, int]) -> dict:
    added = {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                      "single_word": False, "special": True} for t, i in ids.items()}
    return {
        "tokenizer_class": "Qwen2Tokenizer", "model_max_length": 32768, "errors": "replace",
        "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None,
        "add_prefix_space": False, "clean_up_tokenization_spaces": False, "split_special_tokens": False,
        "added_tokens_decoder": added, "chat_template": CHAT_TEMPLATE,
    }


def make_tiny_hf_dir(out_dir: str | Path, *, seed: int = 0, **config_overrides) -> Path:
    """Write a tiny Qwen2.5-VL checkpoint directory; `config_overrides` are TinySpec fields."""
    unknown = set(config_overrides) - {f.name for f in dataclasses.fields(TinySpec)}
    if unknown:
        raise ValueError(f"unknown tiny model settings {sorted(unknown)}; known: "
                         f"{[f.name for f in dataclasses.fields(TinySpec)]}")
    spec = TinySpec(**config_overrides)
    spec.validate()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    tok = build_tokenizer(spec.bpe_vocab)
    ids = _token_ids(tok)
    vocab_size = -(-tok.get_vocab_size(with_added_tokens=True) // 128) * 128  # padded, as Qwen pads
    tok.save(str(out / "tokenizer.json"))
    _write_json(out / "tokenizer_config.json", _tokenizer_config(ids))
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    _write_json(out / "config.json", hf_config(spec, ids, vocab_size))
    _write_json(out / "generation_config.json", {
        "bos_token_id": ids["<|endoftext|>"], "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
        "pad_token_id": ids["<|endoftext|>"],
    })
    image_cfg = ImageProcessorConfig(min_pixels=spec.min_pixels, max_pixels=spec.max_pixels)
    _write_json(out / "preprocessor_config.json", image_cfg.to_dict())

    save_file(random_weights(spec, vocab_size, seed), str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n")
