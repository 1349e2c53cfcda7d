"""What the device benchmarks measure with: the decoder sizes they build, XLA's plan of a
compiled step, the device's peak, and a profile that never costs a case its figures.
The train step's driver and workers use it, and the vision tower and publish benchmarks."""

from __future__ import annotations

import json

from dart_jax.models.config import Qwen25VLConfig, TextConfig, VisionConfig

# name -> (hidden, intermediate, layers, heads, kv heads, vocab, tied): Qwen2.5(-VL) decoders
SIZES = {
    "micro": (64, 128, 2, 2, 1, 1024, True),  # the GPU suite's dry run
    "tiny": (256, 512, 4, 4, 2, 8192, True),
    "0.5B": (896, 4864, 24, 14, 2, 151_936, True),
    "1.5B": (1536, 8960, 28, 12, 2, 151_936, True),
    "3B": (2048, 11008, 36, 16, 2, 151_936, True),
    "7B": (3584, 18944, 28, 28, 4, 152_064, False),
}


def model_config(size: str) -> Qwen25VLConfig:
    """A decoder of SIZES with a one-block vision tower (text-only steps do not run it)."""
    d, inter, layers, heads, kv, vocab, tied = SIZES[size]
    half = d // heads // 2
    side = (half - half // 4) // 2
    text = TextConfig(vocab_size=vocab, hidden_size=d, intermediate_size=inter, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv, mrope_section=(half - 2 * side, side, side))
    vision = VisionConfig(depth=1, hidden_size=64, intermediate_size=128, num_heads=2, out_hidden_size=d,
                          fullatt_block_indexes=(0,))
    return Qwen25VLConfig(text=text, vision=vision, tie_word_embeddings=tied)


def xla_bytes(exe) -> int:
    """What XLA's plan of `exe` holds at once: arguments, outputs and temporaries, an output
    that reuses a donated argument's buffer (the gradient accumulator) counted once."""
    m = exe.memory_analysis()
    return m.temp_size_in_bytes + m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes


def device_peak_bytes(device, exe) -> tuple[int, str]:
    """(bytes, source): `device`'s allocator peak, or where it keeps none (CPU) XLA's memory
    analysis of `exe`, the compiled step."""
    peak = (device.memory_stats() or {}).get("peak_bytes_in_use")
    return (int(peak), "memory_stats") if peak is not None else (xla_bytes(exe), "xla_memory_analysis")


def profiled(result: dict, trace, step) -> dict:
    """The profile of `step`, the figures printed first: a trace that fails or outlives the
    case's time loses no figure (the driver reads them back either way)."""
    print(json.dumps(result), flush=True)
    try:
        return {"profile": trace(step)}
    except Exception as e:  # a profiler the host lacks (no CUPTI) leaves the figures standing
        return {"profile": {"error": f"{type(e).__name__}: {e}"[:300]}}
