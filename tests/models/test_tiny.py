"""The tiny Qwen2.5-VL directory loads in transformers (and, marked vllm/slow, in vLLM CPU)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from dart_jax.agent.image_processing import ImageProcessorConfig
from dart_jax.models.tiny import SPECIAL_TOKENS, TinySpec, make_tiny_hf_dir, tensor_shapes


def _transformers_or_skip():
    """Skipped only where transformers is not installed; a stack that fails on our files fails."""
    return pytest.importorskip("transformers")


def test_files_and_ids_are_consistent(tiny_dir):
    names = {p.name for p in tiny_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
            "preprocessor_config.json", "generation_config.json"} <= names
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(tiny_dir / "tokenizer.json"))
    cfg = json.loads((tiny_dir / "config.json").read_text())
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    assert None not in ids.values() and len(set(ids.values())) == len(SPECIAL_TOKENS)
    assert cfg["image_token_id"] == ids["<|image_pad|>"] and cfg["video_token_id"] == ids["<|video_pad|>"]
    assert cfg["vision_start_token_id"] == ids["<|vision_start|>"]
    assert cfg["vision_end_token_id"] == ids["<|vision_end|>"]
    assert cfg["text_config"]["eos_token_id"] == ids["<|im_end|>"]
    assert cfg["text_config"]["vocab_size"] >= tok.get_vocab_size(with_added_tokens=True)
    assert cfg["vision_config"]["out_hidden_size"] == cfg["text_config"]["hidden_size"]
    gen = json.loads((tiny_dir / "generation_config.json").read_text())
    assert ids["<|im_end|>"] in gen["eos_token_id"]
    # Special tokens inside text are single tokens; other text round-trips byte-exactly.
    text = "Action: click(start_box='<|box_start|>(12,34)<|box_end|>') é 漢字 \n\t"
    enc = tok.encode(text, add_special_tokens=False)
    assert ids["<|box_start|>"] in enc.ids and tok.decode(enc.ids, skip_special_tokens=False) == text
    assert ImageProcessorConfig.from_pretrained(tiny_dir) == ImageProcessorConfig(100 * 28 * 28, 16384 * 28 * 28)


def test_tensor_names_are_hub_names(tiny_dir):
    from safetensors import safe_open
    with safe_open(str(tiny_dir / "model.safetensors"), "np") as f:
        keys = set(f.keys())
        assert f.metadata() == {"format": "pt"}
        embed = f.get_tensor("model.embed_tokens.weight")
    assert "lm_head.weight" in keys and "model.layers.0.self_attn.q_proj.bias" in keys
    assert "visual.blocks.0.attn.qkv.weight" in keys and "visual.merger.mlp.2.weight" in keys
    assert not any(k.startswith(("model.language_model", "model.visual")) for k in keys)
    assert embed.dtype == np.float32


def test_seed_and_overrides(tmp_path):
    a = make_tiny_hf_dir(tmp_path / "a", seed=1)
    b = make_tiny_hf_dir(tmp_path / "b", seed=1)
    c = make_tiny_hf_dir(tmp_path / "c", seed=2, text_layers=3)
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    assert (a / "tokenizer.json").read_text() == (b / "tokenizer.json").read_text()
    assert json.loads((c / "config.json").read_text())["text_config"]["num_hidden_layers"] == 3
    with pytest.raises(ValueError, match="unknown tiny model settings"):
        make_tiny_hf_dir(tmp_path / "d", hidden=3)
    with pytest.raises(ValueError, match="mrope_section"):
        make_tiny_hf_dir(tmp_path / "e", text_hidden=256)


def test_tokenizer_is_the_same_in_a_fresh_process(tiny_dir, tmp_path):
    code = "import sys; from dart_jax.models.tiny import make_tiny_hf_dir; make_tiny_hf_dir(sys.argv[1])"
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True, timeout=120,
                   env={**os.environ, "PYTHONHASHSEED": "123"})
    assert (tmp_path / "tokenizer.json").read_text() == (tiny_dir / "tokenizer.json").read_text()
    assert (tmp_path / "model.safetensors").read_bytes() == (tiny_dir / "model.safetensors").read_bytes()


def test_transformers_loads_tokenizer_processor_and_model(tiny_dir):
    transformers = _transformers_or_skip()
    import torch
    tok = transformers.AutoTokenizer.from_pretrained(tiny_dir)
    assert tok.convert_tokens_to_ids("<|image_pad|>") == json.loads((tiny_dir / "config.json").read_text())[
        "image_token_id"]
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    proc = transformers.AutoProcessor.from_pretrained(tiny_dir)
    assert type(proc).__name__ == "Qwen2_5_VLProcessor"
    model, info = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(
        tiny_dir, dtype=torch.float32, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    n_params = sum(p.numel() for p in model.parameters())
    assert n_params == sum(int(np.prod(s)) for s in tensor_shapes(TinySpec(), model.config.text_config.vocab_size)
                           .values())

    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (210, 160, 3), dtype=np.uint8))
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Click OK."}]}]
    text = proc.apply_chat_template(messages, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n")
    assert text.endswith("<|vision_start|><|image_pad|><|vision_end|>Click OK.<|im_end|>\n<|im_start|>assistant\n")
    inputs = proc(text=[text], images=[image], return_tensors="pt")
    assert int((inputs["input_ids"] == model.config.image_token_id).sum()) == 12 * 9  # 336x252 / 28^2
    with torch.no_grad():
        logits = model(**inputs).logits
    assert logits.shape[-1] == model.config.text_config.vocab_size and torch.isfinite(logits).all()


def test_transformers_save_pretrained_writes_the_same_tensor_names(tiny_dir, tmp_path):
    transformers = _transformers_or_skip()
    from safetensors import safe_open
    model = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(tiny_dir)
    model.save_pretrained(tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), "np") as a, \
            safe_open(str(tiny_dir / "model.safetensors"), "np") as b:
        assert set(a.keys()) == set(b.keys())
        for k in b.keys():
            assert np.array_equal(a.get_tensor(k), b.get_tensor(k)), k


VLLM_SCRIPT = Path(__file__).with_name("vllm_tiny_check.py")


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_cpu_serves_the_tiny_model(tiny_dir, tmp_path):
    """One engine start: a text prompt and an image prompt (as text + image, and as our token ids)."""
    out = tmp_path / "vllm.json"
    proc = subprocess.run([sys.executable, str(VLLM_SCRIPT), str(tiny_dir), str(out)], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    res = json.loads(out.read_text())
    for key in ("text", "image_text", "image_ids"):
        r = res[key]
        assert len(r["token_ids"]) == 4 and len(r["logprobs"]) == 4, r
        assert all(np.isfinite(r["logprobs"])), r
    assert res["our_prompt_token_ids"] == res["image_text"]["prompt_token_ids"]  # vLLM's own expansion
    assert res["image_text"]["prompt_token_ids"] == res["image_ids"]["prompt_token_ids"]
    assert res["image_text"]["token_ids"] == res["image_ids"]["token_ids"]
    assert np.allclose(res["image_text"]["logprobs"], res["image_ids"]["logprobs"], atol=1e-5)
