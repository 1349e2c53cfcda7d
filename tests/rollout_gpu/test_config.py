"""Rollout configs that would not start or not be exact are refused when the config loads,
each in one line: a KV cache that cannot hold one max_model_len sequence of the policy,
shadow loading under CUDA graphs, greedy RL sampling. The KV cache is sized per platform."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dart_jax.config import ConfigError, load
from dart_jax.run.schema import RunConfig
from rollout_gpu.config import EngineConfig, kv_bytes_per_token

ROOT = Path(__file__).resolve().parents[2]
V5P = "configs/tpu/v5p-64.yaml"  # the CLI and the loader run from the repository root, as the config tests do
QWEN_7B = json.loads((ROOT / "configs/models/qwen2.5-vl-7b.config.json").read_text())


def test_the_7b_kv_cache_per_token_and_per_sequence():
    per_token = kv_bytes_per_token(QWEN_7B, "bfloat16")
    assert per_token == 2 * 28 * 4 * 128 * 2  # K and V, 28 layers, 4 KV heads of 128, bf16
    assert per_token * 32768 == 1792 * 2**20  # the 1.9 GB a 32k sequence needs


def test_a_kv_cache_too_small_for_max_model_len_is_refused_in_one_line():
    out = subprocess.run([sys.executable, "-m", "dart_jax.cli", "config", "show", V5P, "rollout.engine.kv_cache_mb=256"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert "kv_cache_mb 256 holds 4681 tokens" in out.stderr and "max_model_len 32768 needs 1792 MiB" in out.stderr
    assert load(RunConfig, V5P, ["rollout.engine.kv_cache_mb=1792"]).rollout.engine.kv_cache_mb == 1792


def test_the_kv_cache_is_sized_per_platform():
    per_token = kv_bytes_per_token(QWEN_7B, "bfloat16")
    gpu = load(RunConfig, V5P).rollout.engine
    assert gpu.kv_cache_mb == 0 and gpu.kv_cache_bytes(per_token, on_cpu=False) is None  # gpu_memory_utilization
    assert gpu.kv_cache_bytes(per_token, on_cpu=True) == per_token * 32768  # one sequence, above the CPU floor
    local = load(RunConfig, "configs/local.yaml").rollout.engine
    assert local.kv_cache_bytes(1024, on_cpu=True) == 256 * 2**20
    assert EngineConfig(kv_cache_mb=64).kv_cache_bytes(1024, on_cpu=False) == 64 * 2**20


@pytest.mark.parametrize("overrides, message", [
    (["rollout.engine.load=shadow", "rollout.engine.enforce_eager=false"], "CUDA graphs keep the addresses"),
    (["rollout.sampling.temperature=0"], "rollout.sampling.temperature: must be > 0"),
])
def test_configs_that_would_not_be_exact_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load(RunConfig, V5P, overrides)
    assert load(RunConfig, V5P, ["rollout.engine.load=inplace", "rollout.engine.enforce_eager=false"])
