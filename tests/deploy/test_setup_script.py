"""scripts/setup.sh's decision to install Debian's packages, run as the script defines it, on a
PATH where commands are present or missing. Its first form returned from the function at the
first missing command with "nothing to install", so a fresh machine got no chromium and the
MiniWoB and pod-rehearsal tests skipped."""

import re
import subprocess
from pathlib import Path

import pytest

SETUP = Path(__file__).resolve().parents[2] / "scripts" / "setup.sh"


def _needs_apt(tmp_path: Path, present: set[str], skip: bool = False) -> bool:
    text = SETUP.read_text()
    commands = re.search(r'^APT_COMMANDS="([^"]+)"$', text, re.M)
    body = re.search(r"^need_apt\(\) \{.*?^\}$", text, re.M | re.S)
    assert commands and body, "setup.sh defines APT_COMMANDS and need_apt"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for c in commands.group(1).split():
        (bin_dir / c).unlink(missing_ok=True)
        if c in present:
            (bin_dir / c).write_text("#!/bin/sh\n")
            (bin_dir / c).chmod(0o755)
    script = f'{commands.group(0)}\n{body.group(0)}\nneed_apt'
    env = {"PATH": str(bin_dir)} | ({"DART_SKIP_APT": "1"} if skip else {})
    return subprocess.run(["/bin/bash", "-c", script], env=env).returncode == 0


@pytest.mark.parametrize("missing", ["chromium", "chromedriver", "mount.nfs", "runuser"])
def test_a_missing_command_is_installed(tmp_path, missing):
    every = set(re.search(r'^APT_COMMANDS="([^"]+)"$', SETUP.read_text(), re.M).group(1).split())
    assert _needs_apt(tmp_path, every - {missing})
    assert not _needs_apt(tmp_path, every - {missing}, skip=True)  # DART_SKIP_APT=1


def test_nothing_is_installed_when_every_command_is_there(tmp_path):
    every = set(re.search(r'^APT_COMMANDS="([^"]+)"$', SETUP.read_text(), re.M).group(1).split())
    assert not _needs_apt(tmp_path, every)
    assert _needs_apt(tmp_path, set())
