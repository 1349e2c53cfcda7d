"""`dart-jax run`'s start on every shipped config: `prepare`, as the command does it."""

import shutil
from pathlib import Path

import pytest

from dart_jax.config import ConfigError, load
from dart_jax.run.schema import RunConfig
from dart_jax.data.tasks import read_task_file
from dart_jax.run.main import prepare

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted(ROOT.glob("configs/**/*.yaml"))


def _shipped(path: Path, tmp_path: Path, monkeypatch) -> RunConfig:
    """The shipped config as `dart-jax run` loads it on its head: only the run root moved into
    tmp_path (with the shared root, when there is one), from a directory holding what the
    config's install downloads (a policy.hf_dir relative to it), with a home of its own."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    cfg = load(RunConfig, path)
    if cfg.policy.hf_dir and not Path(cfg.policy.hf_dir).is_absolute():
        (tmp_path / cfg.policy.hf_dir).mkdir(parents=True)
        shutil.copy(ROOT / cfg.plan.model_config, tmp_path / cfg.policy.hf_dir / "config.json")
    overrides = [f"run.root={tmp_path / 'runs'}"]
    if cfg.tpu.shared_root.kind != "none":  # mounted on the head, as docs/cluster.md says
        (tmp_path / "runs").mkdir()
        overrides.append(f"tpu.shared_root.path={tmp_path / 'runs'}")
    return load(RunConfig, path, overrides)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(ROOT / "configs")))
def test_every_shipped_config_prepares(path, tmp_path, monkeypatch):
    cfg = _shipped(path, tmp_path, monkeypatch).seeded()
    run, policy = prepare(cfg)
    assert (policy / "config.json").is_file()
    assert read_task_file(run.root / cfg.data.tasks.task_file)


def test_a_store_off_the_run_directory_that_exists_is_refused(tmp_path, monkeypatch):
    cfg = _shipped(ROOT / "configs/tpu/v5p-64.yaml", tmp_path, monkeypatch)
    store = cfg.data.store.db_file(Path(cfg.run.root) / cfg.run.name)
    assert store.is_relative_to(tmp_path / "home")  # the head's disk, not the shared run root
    store.parent.mkdir(parents=True)
    store.touch()
    with pytest.raises(ConfigError, match="data.store.db_path: .* holds another run's store"):
        prepare(cfg)
