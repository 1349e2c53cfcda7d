"""The run's policy directories: the one a run starts from, one adopted into a run
(`dart-jax import-hf`), and a checkpoint of a run exported (`dart-jax export-hf`).

    dart-jax import-hf /models/UI-TARS-1.5-7B runs/ui-tars     # then: dart-jax train runs/ui-tars/config.yaml
    dart-jax export-hf runs/x/checkpoints runs/x/export/hf [--step N] [--dtype bfloat16]

import-hf checks the directory (models.hf_check) and points a run at it: RUN_DIR/config.yaml
gets policy.hf_dir (an existing config is updated, else a default run config rooted at
RUN_DIR is written). export-hf reads the run config (by default the run's own,
CHECKPOINT_DIR/../config.yaml) for the trainer settings and the policy directory, and hands
them to the trainer's export (trainer.export).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from dart_jax import config as config_lib
from dart_jax.config import UsageError
from dart_jax.models.hf_check import check_hf_dir
from dart_jax.models.tiny import TinySpec, make_tiny_hf_dir
from dart_jax.run.config import PolicySection, RunSection
from dart_jax.run.schema import RunConfig
from dart_jax.rundir import RunDir
from dart_jax.train.export import export_checkpoint


def initial_policy(cfg: RunConfig, run: RunDir) -> Path:
    """The policy directory the run starts from: `policy.hf_dir`, else a tiny Qwen2.5-VL built
    into the run directory (no download)."""
    if cfg.policy.hf_dir:
        return run.policy_dir(cfg.policy.hf_dir)
    return make_tiny_hf_dir(run.root / "policy-init", seed=cfg.policy.tiny_seed, **tiny_sizes(cfg.policy))


def tiny_sizes(policy: PolicySection) -> dict:
    """`policy.tiny` as TinySpec arguments (whole numbers where the spec takes ints)."""
    kinds = {f.name: f.type for f in dataclasses.fields(TinySpec)}
    unknown = sorted(set(policy.tiny) - set(kinds))
    if unknown:
        raise config_lib.ConfigError("run config", "policy.tiny", f"unknown sizes {unknown}")
    return {k: int(v) if kinds[k] in (int, "int") else v for k, v in policy.tiny.items()}


def import_hf(hf_dir: Path, run_dir: Path) -> dict:
    """Check `hf_dir` and set it as RUN_DIR/config.yaml's policy.hf_dir."""
    hf_dir = hf_dir.absolute()
    summary = check_hf_dir(hf_dir)
    run = RunDir.create(run_dir)
    if run.config_path.exists():
        cfg = config_lib.load(RunConfig, run.config_path)
    else:
        root = run_dir.absolute()
        cfg = RunConfig(run=RunSection(name=root.name, root=str(root.parent)))
    cfg = dataclasses.replace(cfg, policy=dataclasses.replace(cfg.policy, hf_dir=str(hf_dir)))
    run.config_path.write_text(config_lib.dump(cfg))
    return {"config": str(run.config_path), "policy.hf_dir": str(hf_dir), **summary}


def export_hf(checkpoint_dir: Path, out_dir: Path, config_path: Path | None = None, step: int | None = None,
              dtype: str | None = None) -> dict:
    """Write checkpoint `step` of a run as a Hugging Face directory; returns what was written."""
    if not checkpoint_dir.is_dir():
        raise UsageError(f"{checkpoint_dir} is not a directory of checkpoints")
    run_dir = checkpoint_dir.absolute().parent
    config_path = config_path or run_dir / "config.yaml"
    if not config_path.is_file():
        raise UsageError(f"{config_path}: no run config there (pass --config)")
    cfg = config_lib.load(RunConfig, config_path)
    src = RunDir(run_dir).policy_dir(cfg.policy.hf_dir)  # its tokenizer and processor files go along
    return export_checkpoint(checkpoint_dir, out_dir, cfg.trainer, src, step, dtype)
