"""Peak host memory of a Hugging Face import onto an 8-device CPU mesh (fsdp x tp).

    python -m benchmarks.components.hf_import     # ~1 GB fp32 checkpoint, mesh 1x2x4
    python -m benchmarks.components.hf_import --gb 2 --fsdp 4 --tp 2

Writes a Qwen2.5-VL-shaped checkpoint (real vocabulary, tied embeddings, fp32, 3 shards) into a
temporary directory tensor by tensor in small chunks, then imports it in a fresh process that
samples VmRSS every 2 ms. Peak RSS above the process baseline (jax imported, devices up) must stay
under 1.1x the checkpoint size: each device's block is read straight from the file, so the host
holds nothing but the sharded parameters (plus one read chunk). The last line is JSON.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from benchmarks.common import machine  # noqa: E402
from dart_jax.models.config import Qwen25VLConfig, TextConfig, VisionConfig  # noqa: E402
from dart_jax.models.convert import specs_for  # noqa: E402
from dart_jax.models.hf_io import load_model, safetensors_header  # noqa: E402
from dart_jax.models.qwen25vl import abstract_model  # noqa: E402
from dart_jax.models.sharding import make_mesh  # noqa: E402


def bench_config(gb: float) -> Qwen25VLConfig:
    """Qwen2.5-VL-3B proportions (tied, GQA 8:1, 151,936 vocab), layers chosen to reach ~gb GB."""
    text = dict(vocab_size=151936, hidden_size=768, intermediate_size=4096, num_attention_heads=12, num_key_value_heads=2)
    vision = VisionConfig(depth=4, hidden_size=640, intermediate_size=1708, num_heads=8, out_hidden_size=768,
                          fullatt_block_indexes=(1, 3))
    per_layer = 4 * (768 * 768 * 2 + 2 * 768 * 128 + 2 * 128 + 768 + 3 * 768 * 4096 + 2 * 768)
    fixed = 4 * 151936 * 768 + 30_000_000
    layers = max(1, round((gb * 1e9 - fixed) / per_layer))
    return Qwen25VLConfig(text=TextConfig(num_hidden_layers=layers, mrope_section=(8, 12, 12), **text), vision=vision,
                          tie_word_embeddings=True)


def write_checkpoint(config: Qwen25VLConfig, out: Path, shards: int = 3, chunk_bytes: int = 16 << 20) -> int:
    """Random fp32 tensors in original HF names/layout, written in chunks; returns total bytes."""
    _, abstract = abstract_model(config)
    specs = specs_for(abstract, config)
    sizes = [int(np.prod(s.hf_shape)) * 4 for s in specs]
    total, per_shard = sum(sizes), -(-sum(sizes) // shards)
    groups, acc = [[]], 0
    for s, n in zip(specs, sizes):
        if groups[-1] and acc + n > per_shard:
            groups.append([])
            acc = 0
        groups[-1].append(s)
        acc += n
    rng = np.random.default_rng(0)
    weight_map = {}
    for i, group in enumerate(groups):
        name = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        with open(out / name, "wb") as f:
            f.write(safetensors_header([(s.hf_name, np.float32, s.hf_shape) for s in group]))
            for s in group:
                left = int(np.prod(s.hf_shape))
                while left:
                    n = min(left, chunk_bytes // 4)
                    f.write(rng.standard_normal(n, dtype=np.float32).tobytes())
                    left -= n
                weight_map[s.hf_name] = name
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    (out / "config.json").write_text(json.dumps(config.to_hf()))
    return total


def _rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def measure(path: Path, fsdp: int, tp: int) -> dict:
    """Import `path` onto a (1, fsdp, tp) mesh in this process; peak RSS above the baseline."""
    mesh = make_mesh(1, fsdp, tp)
    jax.numpy.zeros(8).block_until_ready()
    baseline = _rss()
    peak, stop = [baseline], threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], _rss())
            time.sleep(0.002)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.perf_counter()
    model, _ = load_model(path, mesh=mesh)
    leaves = jax.tree.leaves(nnx.state(model))
    jax.block_until_ready(leaves)
    seconds = time.perf_counter() - t0
    stop.set()
    sampler.join()
    high_water = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # lifetime high-water mark
    param_bytes = sum(sum(s.data.nbytes for s in x.addressable_shards) for x in leaves)
    return {
        "peak_rss_bytes": max(peak[0], high_water) - baseline,
        "sampled_peak_rss_bytes": peak[0] - baseline,
        "final_rss_bytes": _rss() - baseline,
        "device_param_bytes": param_bytes,
        "seconds": round(seconds, 2),
        "devices": len(jax.devices()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=1.0)
    ap.add_argument("--fsdp", type=int, default=2)
    ap.add_argument("--tp", type=int, default=4)
    ap.add_argument("--measure", type=Path, help=argparse.SUPPRESS)  # child process mode
    args = ap.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args.fsdp, args.tp)))
        return
    config = bench_config(args.gb)
    with tempfile.TemporaryDirectory(prefix="hf_import_") as tmp:
        t0 = time.perf_counter()
        size = write_checkpoint(config, Path(tmp))
        write_s = time.perf_counter() - t0
        cmd = [sys.executable, "-m", "benchmarks.components.hf_import", "--measure", tmp, "--fsdp", str(args.fsdp), "--tp", str(args.tp)]
        child = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if child.returncode:
            sys.exit(f"import failed:\n{child.stderr[-4000:]}")
        result = json.loads(child.stdout.strip().splitlines()[-1])
    print(json.dumps({
        "benchmark": "hf_import",
        "checkpoint_bytes": size,
        "peak_rss_bytes": result["peak_rss_bytes"],
        "ratio": round(result["peak_rss_bytes"] / size, 4),
        "seconds": result["seconds"],
        "write_seconds": round(write_s, 2),
        "mesh": {"data": 1, "fsdp": args.fsdp, "tp": args.tp},
        "text_layers": config.text.num_hidden_layers,
        **{k: result[k] for k in ("sampled_peak_rss_bytes", "final_rss_bytes", "device_param_bytes", "devices")},
        "machine": machine(),
    }))


if __name__ == "__main__":
    main()
