"""The trainer over many batches: bounded compilation, and a killed run resuming exactly."""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
import yaml

from dart_jax.testing.trajectories import text_trajectory
from dart_jax.wire.trajfiles import write_trajectories
from dart_jax.models.sharding import make_mesh
from dart_jax.train.batch import BucketSpec
from dart_jax.train.collate import Collator
from dart_jax.train.config import BucketConfig, LossConfig, OptimizerConfig, TrainerConfig
from dart_jax.train.sources import layout_rl_batch
from dart_jax.train.screens import InlineScreens
from dart_jax.train.trainer import Trainer
from dart_jax.wire.messages import CuratedBatch
from tests.procs import kill_when

SEQ_LENS = (64, 128, 256)


def _curated(rng, batch_id: int) -> CuratedBatch:
    trajs = [text_trajectory(rng, f"{batch_id}-{t}-{i}", f"task{t}", float(i % 2))
             for t in range(2) for i in range(3)]
    return CuratedBatch(batch_id=batch_id, trainer_version=0, trajectories=trajs, screens=[[] for _ in trajs])


def test_fifty_rl_steps_compile_once_per_bucket(tiny_dir):
    listened: list[str] = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda name, *_, **__: listened.append(name) if "backend_compile" in name else None)
    window = Collator.from_pretrained(tiny_dir, BucketSpec((64,), (64,), 1)).config.vision.window_patches
    col = Collator.from_pretrained(tiny_dir, BucketSpec(SEQ_LENS, (window,), rows=4))
    cfg = TrainerConfig(mode="rl", optimizer=OptimizerConfig(lr=1e-4),
                        loss=LossConfig(kl_coef=0.05), buckets=BucketConfig(SEQ_LENS, (window,), 4))
    trainer = Trainer(cfg, tiny_dir, make_mesh(1, 1, 1))
    rng = np.random.default_rng(0)
    seen, compiles_after_warmup, losses = set(), None, []
    for step in range(50):
        batch = _curated(rng, step + 1)
        rl = layout_rl_batch(batch, col, InlineScreens(batch.trajectories), shard=(0, 1))
        seen |= {b.seq_len for b in rl.buckets}
        if step == 11:
            assert seen == set(SEQ_LENS)  # every bucket (and plan size) has occurred by now
            compiles_after_warmup = len(listened)
        losses.append(float(trainer.update_rl(rl, col)["loss/total"]))
    assert trainer.fns.compiles["accumulate"] == len(SEQ_LENS)
    assert trainer.fns.compiles["score"] == len(SEQ_LENS)
    assert trainer.fns.compiles["apply"] == 1 and trainer.fns.compiles["zeros"] == 1
    assert len(listened) == compiles_after_warmup, "steady-state steps compiled again"
    assert all(np.isfinite(losses))


def _write_run_config(tmp: Path, name: str, tiny_dir: Path, data: Path) -> Path:
    cfg = {
        "run": {"name": name, "root": str(tmp)},
        "policy": {"hf_dir": str(tiny_dir)},
        "train": {"steps": 8, "sft_data": str(data), "export": False},
        "trainer": {"mode": "sft", "optimizer": {"lr": 1e-3},
                    "checkpoint": {"every_steps": 2, "keep": 2},
                    "buckets": {"seq_lens": [768, 1024], "num_slots": [768, 1536], "rows": 2}},
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _train(config: Path) -> subprocess.Popen:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""}
    return subprocess.Popen([sys.executable, "-m", "dart_jax.cli", "train", str(config)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _losses(run_dir: Path) -> list[tuple[int, float]]:
    path = run_dir / "metrics" / "trainer.jsonl"
    if not path.exists():
        return []
    return [(r["step"], r["loss/total"]) for r in map(json.loads, path.read_text().splitlines())]


@pytest.mark.slow
def test_killed_run_resumes_with_the_same_losses(tmp_path, tiny_dir, trajs):
    write_trajectories(tmp_path / "demos", trajs, "traj")
    whole = _train(_write_run_config(tmp_path, "whole", tiny_dir, tmp_path / "demos"))
    killed_cfg = _write_run_config(tmp_path, "killed", tiny_dir, tmp_path / "demos")
    proc = _train(killed_cfg)
    kill_when(proc, lambda: any(step >= 5 for step, _ in _losses(tmp_path / "killed")))
    before = _losses(tmp_path / "killed")
    resumed = _train(killed_cfg)
    assert resumed.wait(600) == 0, resumed.stderr.read()[-3000:]
    assert whole.wait(600) == 0, whole.stderr.read()[-3000:]

    reference = dict(_losses(tmp_path / "whole"))
    assert sorted(reference) == list(range(1, 9))
    after = _losses(tmp_path / "killed")[len(before):]
    first = after[0][0]
    assert 3 <= first <= 7 and [s for s, _ in after] == list(range(first, 9))  # from a checkpoint
    for step, loss in before + after:
        assert loss == pytest.approx(reference[step], abs=1e-6), step
