"""Whether a Hugging Face directory is a Qwen2.5-VL policy our loaders read (`dart-jax import-hf`).

    check_hf_dir(Path("/models/UI-TARS-1.5-7B"))   # {"tensors": 729, "dtype": "bfloat16"}, else HFDirError

Checked before a run starts from it: config.json, every tensor's name and shape against the
model's own parameter list, tokenizer.json and preprocessor_config.json.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from dart_jax.agent.image_processing import ImageProcessorConfig
from dart_jax.config import UsageError
from dart_jax.models import hf_io
from dart_jax.models.convert import specs_for
from dart_jax.models.qwen25vl import abstract_model


class HFDirError(UsageError):
    """A Hugging Face directory that does not load, told in one line."""


def source_dtype(hf_dir: Path) -> str | None:
    """The checkpoint's float dtype when it has one (an export then round-trips exactly)."""
    kinds = {str(e.dtype) for e in hf_io.checkpoint_index(hf_dir).values()}
    return kinds.pop() if len(kinds) == 1 else None


def _loads(hf_dir: Path, what: str, load):
    try:
        return load()
    except Exception as e:  # any failure to load is the answer (tokenizers raises bare Exception)
        raise HFDirError(f"{hf_dir}: {what} does not load: {type(e).__name__}: {e}") from None


def check_hf_dir(hf_dir: Path) -> dict:
    """Raise HFDirError unless `hf_dir` is a Qwen2.5-VL directory our loaders read."""
    if not hf_dir.is_dir():
        raise HFDirError(f"{hf_dir} is not a directory")
    config = _loads(hf_dir, "config.json", lambda: hf_io.read_config(hf_dir))
    specs = specs_for(abstract_model(config)[1], config)
    _loads(hf_dir, "the safetensors", lambda: hf_io.check_tensors(specs, hf_io.checkpoint_index(hf_dir),
                                                                  config.tie_word_embeddings))
    _loads(hf_dir, "tokenizer.json", lambda: Tokenizer.from_file(str(hf_dir / "tokenizer.json")))
    _loads(hf_dir, "preprocessor_config.json", lambda: ImageProcessorConfig.from_pretrained(hf_dir))
    return {"tensors": len(specs), "dtype": source_dtype(hf_dir) or "mixed"}
