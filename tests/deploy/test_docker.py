"""deploy/docker: one image per role kind, each built from this checkout under its host kind's lock.

Each Dockerfile is parsed (dockerfile-parse) and held to what the build does (the CPU images
are also built and run: tests/deploy/test_images.py): the default base image pinned to a
patch release of the Python the project needs, the lock of its host kind copied in and
every pip install constrained by it (tests/deploy/test_locks.py resolves each install line
under it), extras that pyproject.toml defines, a real user with a home (GPU images: a C compiler and caches on a
volume that user owns). The manifests' images (deploy/k8s) each have a Dockerfile.
"""

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from dockerfile_parse import DockerfileParser

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "deploy/docker"
IMAGES = {"core": "run", "envs": "envs", "rollout": "rollout", "trainer-tpu": "tpu", "trainer-gpu": "gpu"}
LOCKS = {"core": "cpu", "envs": "cpu", "rollout": "gpu", "trainer-tpu": "tpu", "trainer-gpu": "gpu"}
CACHES = ("XDG_CACHE_HOME", "VLLM_CACHE_ROOT", "TRITON_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE", "HF_HOME")
DEPENDENCIES = ('import sys, tomllib; p = tomllib.load(open("pyproject.toml", "rb")); print(*p["build-system"]["requires"], '
                '*p["project"]["dependencies"], *p["project"]["optional-dependencies"][sys.argv[1]], sep="\\n")')
K8S_IMAGES = {"dart-jax-core": "core", "dart-jax-envs": "envs", "dart-jax-rollout": "rollout",
              "dart-jax-tpu": "trainer-tpu"}


def parse(name: str) -> DockerfileParser:
    return DockerfileParser(fileobj=(DOCKER / f"{name}.Dockerfile").open("rb"))


def instructions(name: str) -> list[dict]:
    return [s for s in parse(name).structure if s["instruction"] != "COMMENT"]


def test_every_dockerfile_is_a_role_image():
    assert sorted(p.name.removesuffix(".Dockerfile") for p in DOCKER.glob("*.Dockerfile")) == sorted(IMAGES)


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_built_from_this_checkout_and_the_lock(name):
    steps = instructions(name)
    # the base a build argument (scripts/build_images.sh passes one made from Debian's packages);
    # its default the official image of the project's Python, pinned
    assert [s["instruction"] for s in steps[:2]] == ["ARG", "FROM"] and steps[1]["value"] == "${BASE}"
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm", parse(name).baseimage)
    copies = [s["value"].split() for s in steps if s["instruction"] == "COPY"]
    assert [f"requirements/lock-{LOCKS[name]}.txt", "lock.txt"] in copies
    copied = {src for c in copies for src in c[:-1]}
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    assert {p.rstrip("*") for p in packages["include"]} | {"pyproject.toml", "README.md"} <= copied
    # the dependencies, under the lock, in a layer before the sources are copied; then the
    # package alone, built offline with the backend that layer installed
    installs = [(i, " ".join(s["value"].split())) for i, s in enumerate(steps)
                if s["instruction"] == "RUN" and "pip install" in s["value"]]
    assert [v for _, v in installs] == [
        f"python3 -c '{DEPENDENCIES}' {IMAGES[name]} > deps.txt"
        " && pip install --constraint lock.txt --requirement deps.txt && rm deps.txt",
        "pip install --no-index --no-deps --no-build-isolation ."]
    before = {src for s in steps[:installs[0][0]] if s["instruction"] == "COPY" for src in s["value"].split()[:-1]}
    assert before == {f"requirements/lock-{LOCKS[name]}.txt", "pyproject.toml"}


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_the_dependency_layer_lists_the_backend_the_project_and_the_extra(name, tmp_path):
    (tmp_path / "pyproject.toml").write_bytes((ROOT / "pyproject.toml").read_bytes())
    out = subprocess.run([sys.executable, "-c", DEPENDENCIES, IMAGES[name]], cwd=tmp_path, capture_output=True,
                         text=True, check=True)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert out.stdout.splitlines() == [*project["build-system"]["requires"], *project["project"]["dependencies"],
                                       *project["project"]["optional-dependencies"][IMAGES[name]]]


@pytest.mark.parametrize("name", sorted(set(IMAGES) - {"trainer-tpu"}))  # libtpu opens the TPU devices as root
def test_images_run_as_a_real_user_with_a_home(name):
    steps = instructions(name)
    runs = " ".join(s["value"] for s in steps if s["instruction"] == "RUN")
    assert "useradd --create-home --uid 1000 --user-group dart" in runs
    assert [s["value"] for s in steps if s["instruction"] == "USER"] == ["dart"]
    assert "HOME=/home/dart" in " ".join(s["value"] for s in steps if s["instruction"] == "ENV")


@pytest.mark.parametrize("name", ["rollout", "trainer-gpu"])
def test_gpu_images_have_a_compiler_and_their_caches_on_a_volume_the_user_owns(name):
    steps = instructions(name)
    runs = " ".join(s["value"] for s in steps if s["instruction"] == "RUN")
    assert "install -y --no-install-recommends build-essential" in runs and "DPkg::Lock::Timeout" in runs
    assert "install -d -o dart -g dart /cache" in runs
    env = " ".join(s["value"] for s in steps if s["instruction"] == "ENV")
    assert all(f"{var}=/cache" in env for var in CACHES)
    assert [s["value"] for s in steps if s["instruction"] == "VOLUME"] == ["/cache"]


def test_the_manifests_images_have_dockerfiles():
    seen = set()
    for path in (ROOT / "deploy/k8s").glob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            seen |= set(re.findall(r"image: (\S+)", yaml.safe_dump(doc or {})))
    assert seen == set(K8S_IMAGES)
    assert set(K8S_IMAGES.values()) <= set(IMAGES)


def test_the_build_context_leaves_out_what_the_images_never_use():
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".git", ".venv", "runs", "deploy/k8s/keys"} <= set(ignored)
