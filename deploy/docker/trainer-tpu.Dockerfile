# dart-jax-tpu: the trainer on TPU hosts (GKE TPU node pools): jax[tpu] (libtpu) under the TPU lock; no torch, no vLLM.
# It runs as root, as GKE's TPU examples do: libtpu opens the TPU devices.
#   docker build -f deploy/docker/trainer-tpu.Dockerfile -t dart-jax-tpu .     (from the repository root)
# BASE: the official image; scripts/build_images.sh passes a Debian-made one (docs/images.md).
ARG BASE=python:3.11.11-slim-bookworm
FROM ${BASE}
ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1
WORKDIR /opt/dart-jax
COPY requirements/lock-tpu.txt lock.txt
COPY pyproject.toml README.md ./
COPY dart_jax dart_jax
COPY rollout_gpu rollout_gpu
COPY envs envs
RUN pip install --constraint lock.txt ".[tpu]"
