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


def test_tensor_parallelism_splits_the_kv_heads_over_the_devices():
    one = kv_bytes_per_token(QWEN_7B, "bfloat16")
    assert kv_bytes_per_token(QWEN_7B, "bfloat16", 2) == one // 2  # 2 of the 4 KV heads a device
    assert kv_bytes_per_token(QWEN_7B, "bfloat16", 8) == one // 4  # fewer heads than devices: one each
    # 32k at TP 2 needs 896 MiB a device: 1024 MiB is enough there, not on one device
    assert load(RunConfig, V5P, ["rollout.engine.tensor_parallel_size=2", "rollout.engine.kv_cache_mb=1024"])
    with pytest.raises(ConfigError, match="kv_cache_mb 1024 holds 18724 tokens"):
        load(RunConfig, V5P, ["rollout.engine.kv_cache_mb=1024"])


GIB = 2**30


def test_shadow_loading_on_a_gpu_needs_room_for_a_second_copy_of_the_weights():
    weights = int(16.6e9)  # 7B in bf16
    with pytest.raises(ValueError, match=r"second copy of the weights \(15.5 GiB a device\).*<= 0.81"):
        EngineConfig(load="shadow").check_shadow(weights, 80 * GIB)  # 0.85 x 80 + 15.5 > 80
    EngineConfig(load="shadow", gpu_memory_utilization=0.7).check_shadow(weights, 80 * GIB)
    EngineConfig(load="shadow", tensor_parallel_size=2).check_shadow(weights, 80 * GIB)  # 7.7 GiB a device
    EngineConfig(load="inplace").check_shadow(weights, 80 * GIB)  # no copy
    EngineConfig().check_shadow(weights, 80 * GIB)  # auto is inplace on a GPU
