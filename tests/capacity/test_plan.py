"""`dart-jax plan`: every number of a tiny plan computed by hand, the formulas, the CLI, the 7B configs."""

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dart_jax.config import ConfigError, from_dict, load
from dart_jax.run.schema import RunConfig
from dart_jax.models.config import Qwen25VLConfig
from dart_jax.models.hf_io import read_config
from dart_jax.capacity import plan as plan_lib
from dart_jax.capacity.chips import GIB, parse_accelerator_type
from dart_jax.capacity import sizes
from dart_jax.capacity.memory import Stack, activations, attention_extra

ROOT = Path(__file__).resolve().parents[2]
MODEL_7B = ROOT / "configs/models/qwen2.5-vl-7b.config.json"
TPU_CONFIGS = sorted((ROOT / "configs/tpu").glob("*.yaml"))

# text: D 64, 2 layers, 4 heads of 16 (Q 64), 2 kv heads (K 32), F 128, vocab 1000, untied
# vision: D 32, 2 blocks (block 1 full attention), 2 heads, F 48, 112 px windows (64 patch slots)
TINY = {
    "model_type": "qwen2_5_vl", "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "tie_word_embeddings": False,
    "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]}, "image_token_id": 990, "video_token_id": 991,
    "vision_start_token_id": 992, "vision_end_token_id": 993,
    "vision_config": {"depth": 2, "hidden_size": 32, "num_heads": 2, "intermediate_size": 48, "out_hidden_size": 64,
                      "patch_size": 14, "temporal_patch_size": 2, "spatial_merge_size": 2, "window_size": 112,
                      "fullatt_block_indexes": [1], "in_chans": 3},
}


def tiny_run(tmp_path, **trainer) -> RunConfig:
    path = tmp_path / "tiny.config.json"
    path.write_text(json.dumps(TINY))
    return from_dict(RunConfig, {
        "plan": {"model_config": str(path), "chip": "h100", "screenshots": 2, "screen_width": 224,
                 "screen_height": 224, "min_pixels": 56 * 56},
        "trainer": {"mode": "rl", "compute_dtype": "bfloat16", "remat": "full", "mesh": {"fsdp": 2, "tp": 2},
                    "buckets": {"seq_lens": [128, 256], "num_slots": [512, 1024], "rows": 4},
                    "kernel": {"chunk_tokens": 64, "chunk_vocab": 300}, **trainer}})


# Parameters by hand. Total: text 202,304 + vision 80,480.
#   text: embed 1000*64 = 64,000; per layer q 64*64+64, k and v 64*32+32 each, o 64*64, mlp 3*64*128,
#   2 norms of 64 = 37,120 (x2 = 74,240); final norm 64; lm_head 64*1000 = 64,000.
#   vision: patch embed 1176*32 = 37,632; per block 2 norms 64, qkv 32*96+96, proj 32*32+32,
#   gate/up 32*48+48 each, down 48*32+32 = 9,024 (x2 = 18,048); merger ln 32, mlp.0 128*128+128,
#   mlp.2 128*64+64 = 24,800.
TOTAL = 202_304 + 80_480
# On one chip of fsdp=2 x tp=2, by the sharding table (a rule applies where its mesh axis divides):
#   text: embed (vocab/tp, embed/fsdp) 16,000; per layer q kernel 1,024 + bias (q_heads/tp) 32, k and v
#   512 + 16 each, o 1,024, mlp 3*2,048, norms 128 = 9,408 (x2); final norm 64; lm_head 16,000 -> 50,880.
#   vision: patch embed (patch, vision_embed/fsdp) 18,816; per block norms 64, qkv 768 + bias 48, proj
#   256 + bias (vision_embed/fsdp) 16, gate/up 384 + 24 each, down 384 + 16 = 2,368 (x2); merger ln 32,
#   mlp.0 (merger_in/fsdp, vision_mlp/tp) 4,096 + 64, mlp.2 2,048 + bias (embed/fsdp) 32 = 6,272 -> 29,824.
P_CHIP = 50_880 + 29_824
# Split by tp only: a decoder layer q 2,048+32, k and v 1,024+16 each, o 2,048, mlp 3*4,096, norms 128
# = 18,624 (a vision block: 4,576); the LM head 64*1000/2 = 32,000.
LAYER_TP, HEAD_TP = 18_624, 32_000


def test_tiny_plan_every_number_by_hand(tmp_path):
    plan = plan_lib.build(tiny_run(tmp_path), "tiny")
    terms = {t.name: t.bytes for t in (*plan.static, *plan.step, plan.apply)}
    # R: 4 rows per host x 1 host (4 chips of an 8-GPU host) = 4, over data*fsdp = 2 -> 2 rows per chip
    R, T, S, c = 2, 256, 1024, 2
    assert terms["parameters"] == terms["gradients"] == terms["reference"] == 4 * P_CHIP == 322_816
    assert terms["optimizer"] == terms["apply"] == 8 * P_CHIP
    # text, remat full: Q = 64/2, K = 32/2, F = 128/2 per chip; carry 64; all 4*64 + 2*32 + 2*16 + 4*64 = 608
    # L*N*carry*c + N*all*c with N = R*T = 512 (flash attention: nothing of size T)
    assert terms["text act."] == 2 * 512 * 64 * 2 + 512 * 608 * 2 == 753_664
    # vision: all = 4*32 + 2*16 + 2*16 + 4*24 = 288, N = R*S = 2048; the window block (1 head per chip,
    # 64 keys) keeps 64*(4 + 2) = 384 B per slot live; merger N*(3*32 + 64/4)*2
    assert terms["vision act."] == 2 * 2048 * 32 * 2 + 2048 * (288 * 2 + 384) + 2048 * (96 + 16) * 2 == 2_686_976
    # kernel: 64 tokens // 4 rows = 16 positions x 2 rows x 300 vocab, 3 fp32 blocks; LM head in c and
    # its fp32 gradient; final hidden states and their gradient 2*R*T*64*c
    assert terms["log-prob kernel"] == 3 * 16 * R * 300 * 4 + HEAD_TP * (2 + 4) + 2 * R * T * 64 * c == 438_272
    assert terms["gathered"] == 2 * LAYER_TP * c == 74_496
    assert terms["inputs"] == R * (S * (1176 + 3) + T * 10) * 4 == 9_678_848
    # one micro-batch's fp32 gradient beside the accumulator; one decoder layer's weight gradient
    # before its reduce-scatter (split by tp only, fp32); the MLP backward: gate and up output
    # gradients of the rebuilt layer, text 2*R*T*(128/2)*c = 131,072 or vision 2*R*S*(48/2)*c
    # = 196,608, whichever is larger
    assert terms["micro grad"] == 4 * P_CHIP == 322_816
    assert terms["layer grad"] == 4 * LAYER_TP == 74_496
    assert terms["MLP backward"] == max(2 * R * T * 64 * c, 2 * R * S * 24 * c) == 196_608
    static = (4 + 4 + 4 + 8) * P_CHIP  # params, gradients, reference (4P each) + optimizer (8P)
    step = 753_664 + 2_686_976 + 438_272 + 74_496 + 9_678_848 + 322_816 + 74_496 + 196_608
    assert plan.peak == static + step == 15_840_256
    assert plan.fits and plan.warnings == ()


def test_tiny_plan_params_and_screens(tmp_path):
    cfg = tiny_run(tmp_path)
    model, _ = plan_lib.model_config(cfg, "tiny")
    p = sizes.param_counts(model, {"data": 1, "fsdp": 2, "tp": 2})
    assert (p.total, p.chip, p.layer, p.head) == (TOTAL, P_CHIP, LAYER_TP, HEAD_TP)
    # 224x224 stays 224x224 (a multiple of 28 inside the pixel bounds): 16x16 patches, 8x8 merged tokens,
    # 2x2 windows of 4x4 merged tokens x 4 patches = 256 slots
    s = sizes.screens_of(model, cfg.plan, cfg.trainer)
    assert (s.resized, s.patches, s.tokens, s.slots) == ((224, 224), 256, 64, 256)


def test_dart_screenshot_geometry():
    cfg = from_dict(RunConfig, {"plan": {"model_config": str(MODEL_7B)},
                                "trainer": {"buckets": {"num_slots": [11520]}}})
    s = sizes.screens_of(Qwen25VLConfig.from_hf(json.loads(MODEL_7B.read_text())), cfg.plan, cfg.trainer)
    # 1920x1080 -> 1932x1092 (78 x 138 patches); 39 x 69 merged tokens in 10 x 18 windows of 64 slots
    assert (s.resized, s.patches, s.tokens, s.slots) == ((1092, 1932), 10_764, 2_691, 180 * 64)


def test_activation_formulas_by_remat_and_attention():
    s = Stack(layers=2, hidden=64, q=32, kv=16, mlp=64)  # carry 64, dots 320, all 608
    flash = [attention_extra(2, 256, 2, dense=False)] * 2
    dense = [attention_extra(2, 256, 2, dense=True)] * 2  # 2 heads x 256 keys x (4 + 2) and x 4
    assert dense[0] == (3072, 2048)
    assert activations(s, "none", 512, 2, flash)[0] == 2 * 512 * 608 * 2
    assert activations(s, "dots", 512, 2, flash)[0] == 2 * 512 * (64 + 320) * 2 + 512 * 608 * 2
    assert activations(s, "none", 512, 2, dense)[0] == 512 * (2 * 608 * 2 + 2 * 3072)
    assert activations(s, "full", 512, 2, dense)[0] == 512 * (2 * 64 * 2 + 608 * 2 + 3072)
    assert activations(s, "dots", 512, 2, dense)[0] == 512 * (2 * 384 * 2 + 2 * 2048 + 608 * 2 + 3072)
    with pytest.raises(ValueError, match="no memory formula"):
        activations(s, "offload", 512, 2, flash)


def test_a_remat_policy_without_a_formula_is_a_config_error(tmp_path):
    cfg = tiny_run(tmp_path)
    trainer = dataclasses.replace(cfg.trainer, remat="offload")  # a name the model may add; no formula yet
    with pytest.raises(ConfigError, match="tiny: trainer.remat: remat policy 'offload' has no memory formula"):
        plan_lib.build(dataclasses.replace(cfg, trainer=trainer), "tiny")


def test_accelerator_types():
    assert parse_accelerator_type("v5p-64") == ("v5p", 32)  # v5p counts TensorCores
    assert parse_accelerator_type("v6e-64") == ("v6e", 64)
    assert parse_accelerator_type("v5litepod-256") == ("v5e", 256)
    for bad in ("v5p-63", "v4-8", "v6e", "h100-8"):
        with pytest.raises(ValueError, match="accelerator type"):
            parse_accelerator_type(bad)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "dart_jax.cli", "plan", *args], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)


def test_cli_warns_when_it_does_not_fit_and_strict_fails(tmp_path):
    cfg = tiny_run(tmp_path)
    path = tmp_path / "run.yaml"
    from dart_jax.config import dump
    path.write_text(dump(cfg))
    ok = _cli(str(path))
    assert ok.returncode == 0 and "WARNING" not in ok.stdout and "peak" in ok.stdout, ok.stderr[-2000:]
    small = ["plan.chip=v5e", "plan.usable_hbm=0.0005"]  # 8.2 MiB usable of 16 GiB < the 14.5 MiB peak
    for strict, rc in (([], 0), (["--strict"], 1)):
        out = _cli(str(path), *small, *strict)
        assert out.returncode == rc, out.stderr[-2000:]
        warnings = [line for line in out.stdout.splitlines() if line.startswith("WARNING")]
        assert warnings == ["WARNING: does not fit: peak 0.01 GiB > 0.01 GiB usable (0% of TPU v5e's 16 GiB)"]


def test_cli_without_a_model_is_one_config_error():
    out = _cli("configs/local.yaml", "plan.chip=v5p")
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert "configs/local.yaml: plan.model_config: empty" in out.stderr


def test_7b_config_json_is_read_by_the_loader(tmp_path):
    (tmp_path / "config.json").write_text(MODEL_7B.read_text())
    cfg = read_config(tmp_path)
    t, v = cfg.text, cfg.vision
    assert (t.hidden_size, t.num_hidden_layers, t.num_attention_heads, t.num_key_value_heads) == (3584, 28, 28, 4)
    assert (t.intermediate_size, t.vocab_size, t.rope_theta, t.mrope_section) == (18944, 152064, 1e6, (16, 24, 24))
    assert not cfg.tie_word_embeddings
    assert (v.depth, v.hidden_size, v.num_heads, v.intermediate_size, v.out_hidden_size) == (32, 1280, 16, 3420, 3584)
    assert (v.patch_size, v.temporal_patch_size, v.spatial_merge_size, v.window_size) == (14, 2, 2, 112)
    assert v.fullatt_block_indexes == (7, 15, 23, 31)


@pytest.mark.parametrize("path", TPU_CONFIGS, ids=lambda p: p.name)
def test_tpu_config_headers_state_the_plan(path, monkeypatch):
    """Each configs/tpu file's header quotes its command and the plan's peak; they must agree."""
    monkeypatch.chdir(ROOT)  # plan.model_config is relative to the checkout
    header = path.read_text().split("\nrun:")[0]
    assert f"dart-jax tpu submit configs/tpu/{path.name}" in header
    quoted = float(re.search(r"peak ([\d.]+) GiB per chip", header).group(1))
    plan = plan_lib.build(load(RunConfig, path), str(path))
    assert plan.fits and plan.warnings == ()
    assert quoted == round(plan.peak / GIB, 1)
