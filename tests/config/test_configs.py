"""Every config in configs/ loads into the run config, and the CLI reports bad ones in one line."""

import subprocess
import sys
from pathlib import Path

import pytest

from dart_jax.config import ConfigError, load
from dart_jax.run.schema import RunConfig

CONFIGS = sorted(Path(__file__).resolve().parents[2].glob("configs/**/*.yaml"))


def test_there_are_configs():
    assert CONFIGS


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_loads(path):
    assert isinstance(load(RunConfig, path), RunConfig)


@pytest.mark.parametrize("args, expected", [
    (["configs/local.yaml", "envs.lease_z=3"], "configs/local.yaml: envs.lease_z: unknown key"),
    (["configs/local.yaml", "data.curation.group_size=big"],
     "configs/local.yaml: data.curation.group_size: expected int, got str 'big'"),
    (["configs/local.yaml", "tasks.demo_concurrency=0"], "configs/local.yaml: tasks.demo_concurrency: must be >= 1"),
    (["configs/nope.yaml"], "configs/nope.yaml: <root>: cannot read config file"),
])
def test_cli_bad_config_is_one_line(args, expected):
    out = subprocess.run([sys.executable, "-m", "dart_jax.cli", "config", "show", *args],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and expected in out.stderr


def test_the_old_train_section_still_loads_into_trainer_with_a_deprecation_line(tmp_path, caplog):
    old, new = tmp_path / "old.yaml", tmp_path / "new.yaml"
    old.write_text("trainer: {mode: sft}\ntrain: {steps: 3, export: false}\n")
    new.write_text("trainer: {mode: sft, steps: 3, export: false, max_seconds: 60}\n")
    assert load(RunConfig, old, ["train.max_seconds=60"]) == load(RunConfig, new)
    for key in ("steps", "export", "max_seconds"):
        assert f"old.yaml: `train.{key}` is deprecated: it is now `trainer.{key}`" in caplog.text
    with pytest.raises(ConfigError, match="train.steps: renamed to `trainer.steps`, which is also set"):
        load(RunConfig, old, ["trainer.steps=4"])
