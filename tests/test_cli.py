"""Every subcommand answers a bad path, id or value with one line on stderr and exit code 2."""

from pathlib import Path

import pytest

from dart_jax import cli

ROOT = Path(__file__).resolve().parents[1]
LOCAL = str(ROOT / "configs" / "local.yaml")
TPU = str(ROOT / "configs" / "tpu" / "v5p-64.yaml")


@pytest.mark.parametrize("argv, says", [
    (["config", "show", LOCAL, "trainer.optimizer.lr=-1"], "trainer.optimizer.lr: must be > 0"),
    (["env-server", "/nonexistent/run.yaml"], "cannot read config file"),
    (["data-manager", LOCAL, "data.nope=1"], "data.nope: unknown key"),
    (["rollout", LOCAL, "rollout.worker_id=../w0"], "worker_id '../w0'"),
    (["train", LOCAL, "trainer.steps=0"], "trainer.steps: must be >= 1"),
    (["run", LOCAL, "run.name=../escape"], "must be a plain directory name"),
    (["eval", LOCAL, "--label", "../../x"], "eval label '../../x'"),
    (["eval", LOCAL, "--policy", "/nonexistent"], "--policy /nonexistent: no such directory"),
    (["keys", "KEYDIR", "../x"], "key name '../x'"),
    (["keys", "/proc/no-such-dir/keys", "trainer"], "cannot write the key files there"),
    (["plan", "/nonexistent.yaml"], "cannot read config file"),
    (["tpu", "submit", TPU, "--dry-run"], "tpu.project: required by `dart-jax tpu`"),
    (["export-hf", "/nonexistent/checkpoints", "OUT"], "is not a directory of checkpoints"),
    (["import-hf", "/nonexistent/hf", "OUT"], "/nonexistent/hf is not a directory"),
    (["no-such-command"], "invalid choice"),
])
def test_a_bad_argument_is_one_line_and_exit_2(argv, says, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # whatever a command writes lands here
    code = _exit_code([str(tmp_path / a) if a in ("KEYDIR", "OUT") else a for a in argv])
    err = [line for line in capsys.readouterr().err.splitlines()
           if " INFO " not in line]  # a role's own log lines, once it set up logging
    assert code == 2
    assert len(err) == 1 and says in err[0] and err[0].startswith("dart-jax: "), err


def _exit_code(argv: list[str]) -> int:
    """The command's exit code, whether it returns it or argparse exits with it."""
    try:
        return cli.main(argv)
    except SystemExit as e:
        return e.code



def test_a_policy_this_user_cannot_read_is_a_config_error_not_a_crash(tmp_path):
    """A slice host given a path into the head's 0700 home (docs/cluster.md, finding 4): exit 2,
    which the supervisor never submits again, not exit 1 retried max_restarts times. The
    command runs without the capabilities that let root read what is not its own."""
    import os
    import shutil
    import subprocess
    import sys

    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv to make a directory this process cannot read")
    home = tmp_path / "home"
    (home / "policy").mkdir(parents=True)
    (home / "policy" / "config.json").write_text("{}")
    for p in (home, home / "policy", home / "policy" / "config.json"):
        os.chown(p, 65534, 65534)  # nobody's
    home.chmod(0o700)
    out = subprocess.run(["setpriv", "--bounding-set=-dac_override,-dac_read_search", sys.executable, "-m",
                          "dart_jax.cli", "train", LOCAL, f"run.root={tmp_path}", "run.name=r",
                          f"policy.hf_dir={home}/policy"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    err = [line for line in out.stderr.splitlines() if " INFO " not in line]
    assert out.returncode == 2, out.stderr[-2000:]
    assert len(err) == 1 and "cannot be read by uid 0" in err[0] and "Permission denied" in err[0], err
