"""The publish conversion at 7B shapes: device parameters -> HF names, torch layout, bf16 host buckets, in GB/s.

    python -m benchmarks.gpu.publish_convert                        # embed, lm_head, 2 decoder layers, 2 vision blocks
    python -m benchmarks.gpu.publish_convert --text-layers 4 --vision-blocks 4
    python -m benchmarks.gpu.publish_convert --dry                  # the same on a micro policy (any host)

A layer set of Qwen2.5-VL-7B's shapes (its embedding and untied LM head, final norm, patch
embedding and merger, `--text-layers` decoder layers and `--vision-blocks` vision blocks)
is created on the default device as the trainer holds it (fp32, stacked layers). Each pass
runs the conversion a publish runs, `publish_buckets`, to the end: every tensor on the
host in torch layout and bf16, grouped into buckets. Pass 1 pays what a first publish pays
(op compilation); the figure is pass 2's: bf16 bytes out per second (`gb_per_s`), with the
fp32 bytes read per second beside it and the time a whole 7B policy would take at that rate.
Every tensor's name, shape and dtype is checked, and three tensors' values (the embedding,
a decoder projection, the patch embedding) against a host-side reference. Last line: JSON.
Packing into wire frames and CRC-32 are host copies measured by benchmarks.components.weight_sync.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import ml_dtypes
import numpy as np

from benchmarks.common import machine
from benchmarks.gpu.measure import model_config
from dart_jax.models.config import Qwen25VLConfig

BF16 = np.dtype(ml_dtypes.bfloat16)
BUCKET_MB = 4  # the publisher's default (WeightSyncConfig.bucket_mb; a test holds them equal)


CONVERSION = ("dart_jax.models.convert.hf_buckets: transpose and cast to bf16 inside jit on the device "
              "(models/convert.to_hf_device, as the publisher), then device-to-host per tensor")


def publish_buckets(params, config: Qwen25VLConfig, bucket_bytes: int):
    """The conversion under measurement: buckets (lists of (HF name, host array in torch
    layout and bf16)) of `params`. The layout transpose and the cast run on the device that
    holds each parameter, inside jit, before the device-to-host copy (what
    `WeightPublisher.publish` runs before it cuts the results into pieces)."""
    from dart_jax.models.convert import hf_buckets

    return hf_buckets(params, config, bucket_bytes, BF16)


def host_reference(spec, x: np.ndarray) -> np.ndarray:
    """The torch layout of one fp32 Flax parameter, computed on the host with numpy."""
    if spec.kind == "linear":
        x = x.T
    elif spec.kind == "conv3d":
        x = x.T.reshape(spec.hf_shape)
    return x.astype(BF16)


def layer_set(text_layers: int, vision_blocks: int, dry: bool = False) -> Qwen25VLConfig:
    """Qwen2.5-VL-7B's shapes (dry: the micro policy's) with only this many layers and blocks."""
    base = model_config("micro") if dry else Qwen25VLConfig()
    text = dataclasses.replace(base.text, num_hidden_layers=text_layers)
    vision = dataclasses.replace(base.vision, depth=vision_blocks, fullatt_block_indexes=(vision_blocks - 1,))
    return dataclasses.replace(base, text=text, vision=vision)


def convert_pass(params, config: Qwen25VLConfig, bucket_bytes: int, keep: set[str]) -> dict:
    """One conversion to the end: seconds, bytes, counts, each tensor's (shape, dtype), and
    the tensors named in `keep`."""
    start = time.perf_counter()
    out_bytes, buckets, seen, kept = 0, 0, {}, {}
    for bucket in publish_buckets(params, config, bucket_bytes):
        buckets += 1
        for name, x in bucket:
            x = np.asarray(x)  # a bucket is on the host; an array that is not yet arrives here
            out_bytes += x.nbytes
            seen[name] = (tuple(x.shape), x.dtype)
            if name in keep:
                kept[name] = x
    return {"s": time.perf_counter() - start, "out_bytes": out_bytes, "buckets": buckets, "seen": seen, "kept": kept}


def check(params, config: Qwen25VLConfig, seen: dict, kept: dict) -> int:
    """Every tensor present in its torch shape and bf16; the kept ones equal to the host
    reference (fp32 parameter -> `host_reference`). Returns how many values were compared."""
    from flax import nnx

    from dart_jax.models.convert import specs_for

    specs = specs_for(params, config)
    want = {s.hf_name: (tuple(s.hf_shape), BF16) for s in specs}
    if seen != want:
        wrong = sorted(set(seen.items()) ^ set(want.items()))[:5]
        raise AssertionError(f"the conversion's tensors differ from the specs: {wrong}")
    flat = dict(nnx.to_flat_state(params))
    for spec in specs:
        if spec.hf_name in kept:
            x = flat[spec.path].get_value()
            x = np.asarray(x if spec.layer is None else x[spec.layer])
            if not np.array_equal(kept[spec.hf_name].view(np.uint16), host_reference(spec, x).view(np.uint16)):
                raise AssertionError(f"{spec.hf_name}: values differ from the host reference")
    return len(kept)


def full_7b_bytes() -> int:
    """bf16 bytes of a whole Qwen2.5-VL-7B (no parameter memory: abstract shapes)."""
    from dart_jax.models.convert import specs_for
    from dart_jax.models.qwen25vl import abstract_model

    config = Qwen25VLConfig()
    _, state = abstract_model(config)
    return sum(int(np.prod(s.hf_shape)) * BF16.itemsize for s in specs_for(state, config))


def measure(text_layers: int = 2, vision_blocks: int = 2, bucket_bytes: int = BUCKET_MB << 20, dry: bool = False,
            progress=lambda doc: None) -> dict:
    """The figures of two passes (`progress(figures)` after each: after the first they are the
    first pass's), then the check."""
    import jax
    from flax import nnx

    from dart_jax.models.qwen25vl import create_model

    config = layer_set(text_layers, vision_blocks, dry)
    params = nnx.state(nnx.jit(lambda: create_model(config))())
    jax.block_until_ready(params)
    param_bytes = sum(x.nbytes for x in jax.tree.leaves(params))
    doc = {"device": jax.devices()[0].device_kind, "text_layers": text_layers, "vision_blocks": vision_blocks,
           "bucket_bytes": bucket_bytes, "conversion": CONVERSION, "param_bytes": param_bytes,
           "full_7b_bytes": full_7b_bytes()}
    keep = {"model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight", "visual.patch_embed.proj.weight"}
    for n in (1, 2):
        one = convert_pass(params, config, bucket_bytes, keep)
        rate = one["out_bytes"] / one["s"]
        doc |= {"passes": n, "tensors": len(one["seen"]), "buckets": one["buckets"], "out_bytes": one["out_bytes"],
                "s": one["s"], "gb_per_s": rate / 1e9, "fp32_gb_per_s": param_bytes / one["s"] / 1e9,
                "full_7b_s": doc["full_7b_bytes"] / rate}
        doc.setdefault("first_s", one["s"])
        progress(doc)
    doc["values_checked"] = check(params, config, one["seen"], one["kept"])
    return doc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--text-layers", type=int, default=2)
    ap.add_argument("--vision-blocks", type=int, default=2)
    ap.add_argument("--bucket-mb", type=int, default=BUCKET_MB)
    ap.add_argument("--dry", action="store_true", help="the micro policy's shapes")
    args = ap.parse_args()
    out = measure(args.text_layers, args.vision_blocks, args.bucket_mb << 20, args.dry)
    print(json.dumps({"benchmark": "publish_convert", **out, "machine": machine()}))


if __name__ == "__main__":
    main()
