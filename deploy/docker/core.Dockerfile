# dart-jax-core: the data manager (and `dart-jax run`, `dart-jax ping`): no JAX, no torch.
#   docker build -f deploy/docker/core.Dockerfile -t dart-jax-core .     (from the repository root)
# BASE: the official image; scripts/build_images.sh passes a Debian-made one (docs/images.md).
ARG BASE=python:3.11.11-slim-bookworm
FROM ${BASE}
ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 HOME=/home/dart XDG_CACHE_HOME=/home/dart/.cache
RUN useradd --create-home --uid 1000 --user-group dart
WORKDIR /opt/dart-jax
COPY requirements/lock-cpu.txt lock.txt
# The dependencies first, a layer keyed on pyproject.toml and the lock alone (a change to the
# sources reuses it): the build backend, the project's and the extra's requirements, under the lock.
COPY pyproject.toml ./
RUN python3 -c 'import sys, tomllib; p = tomllib.load(open("pyproject.toml", "rb")); print(*p["build-system"]["requires"], *p["project"]["dependencies"], *p["project"]["optional-dependencies"][sys.argv[1]], sep="\n")' run > deps.txt \
    && pip install --constraint lock.txt --requirement deps.txt && rm deps.txt
COPY README.md ./
COPY dart_jax dart_jax
COPY rollout_gpu rollout_gpu
COPY envs envs
RUN pip install --no-index --no-deps --no-build-isolation .
USER dart
