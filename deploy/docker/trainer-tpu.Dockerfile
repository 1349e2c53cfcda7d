# dart-jax-tpu: the trainer on TPU hosts (GKE TPU node pools): jax[tpu] (libtpu) under the TPU lock; no torch, no vLLM.
# It runs as root, as GKE's TPU examples do: libtpu opens the TPU devices.
#   docker build -f deploy/docker/trainer-tpu.Dockerfile -t dart-jax-tpu .     (from the repository root)
# BASE: the official image; scripts/build_images.sh passes a Debian-made one (docs/images.md).
ARG BASE=python:3.11.11-slim-bookworm
FROM ${BASE}
ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1
WORKDIR /opt/dart-jax
COPY requirements/lock-tpu.txt lock.txt
# The dependencies first, a layer keyed on pyproject.toml and the lock alone (a change to the
# sources reuses it): the build backend, the project's and the extra's requirements, under the lock.
COPY pyproject.toml ./
RUN python3 -c 'import sys, tomllib; p = tomllib.load(open("pyproject.toml", "rb")); print(*p["build-system"]["requires"], *p["project"]["dependencies"], *p["project"]["optional-dependencies"][sys.argv[1]], sep="\n")' tpu > deps.txt \
    && pip install --constraint lock.txt --requirement deps.txt && rm deps.txt
COPY README.md ./
COPY dart_jax dart_jax
COPY rollout_gpu rollout_gpu
COPY envs envs
RUN pip install --no-index --no-deps --no-build-isolation .
