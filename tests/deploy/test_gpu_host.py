"""scripts/check_gpu_host.sh, which `setup_host.sh gpu|rollout` runs before installing: a
driver older than CUDA 13's floor, no driver, or no C compiler is one line and exit 1; a
host with R580+ and a compiler passes. The driver is a stand-in nvidia-smi on PATH."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts/check_gpu_host.sh"


def host(tmp_path: Path, driver: str | None, compiler: bool) -> dict[str, str]:
    """A PATH with the tools the check uses, a stand-in nvidia-smi, and cc or not."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for tool in ("head", "tr"):
        (bin_ / tool).symlink_to(shutil.which(tool))
    if compiler:
        (bin_ / "cc").symlink_to(shutil.which("cc") or shutil.which("gcc"))
    if driver is not None:
        smi = bin_ / "nvidia-smi"
        smi.write_text(f"#!/bin/sh\necho '{driver}'\necho '{driver}'\n")
        smi.chmod(0o755)
    return {**os.environ, "PATH": str(bin_)}


@pytest.mark.parametrize("driver, compiler, line", [
    ("550.54.15", True, "NVIDIA driver 550.54.15 is older than R580, which CUDA 13 needs"),
    (None, True, "no NVIDIA driver (nvidia-smi not found): CUDA 13 needs driver R580 or newer"),
    ("580.65.06", False, "no C compiler"),
])
def test_a_host_that_cannot_run_the_gpu_lock_is_told_in_one_line(tmp_path, driver, compiler, line):
    out = subprocess.run(["/bin/bash", str(SCRIPT)], env=host(tmp_path, driver, compiler), capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 1 and out.stderr.count("\n") == 1 and line in out.stderr, out.stderr


def test_a_host_with_r580_and_a_compiler_passes(tmp_path):
    out = subprocess.run(["/bin/bash", str(SCRIPT)], env=host(tmp_path, "580.82.07", True), capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("check_gpu_host: driver 580.82.07 (R580 or newer), C compiler ")
