# dart-jax-core: the data manager (and `dart-jax run`, `dart-jax ping`): no JAX, no torch.
#   docker build -f deploy/docker/core.Dockerfile -t dart-jax-core .     (from the repository root)
# BASE: the official image; scripts/build_images.sh passes a Debian-made one (docs/images.md).
ARG BASE=python:3.11.11-slim-bookworm
FROM ${BASE}
ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 HOME=/home/dart XDG_CACHE_HOME=/home/dart/.cache
RUN useradd --create-home --uid 1000 --user-group dart
WORKDIR /opt/dart-jax
COPY requirements/lock-cpu.txt lock.txt
COPY pyproject.toml README.md ./
COPY dart_jax dart_jax
COPY rollout_gpu rollout_gpu
COPY envs envs
RUN pip install --constraint lock.txt ".[run]"
USER dart
