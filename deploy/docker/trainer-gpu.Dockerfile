# dart-jax-gpu: the trainer on GPU hosts: jax[cuda13] and vLLM for a rollout worker on the same
# box, one CUDA stack (13) from the registry's wheels under the GPU lock; the node gives the
# driver (R580 or newer).
#   docker build -f deploy/docker/trainer-gpu.Dockerfile -t dart-jax-gpu .     (from the repository root)
# A C compiler is in the image (Triton, FlashInfer's JIT); JAX's compilation cache and vLLM's,
# Triton's, FlashInfer's and Hugging Face's caches go to /cache, a volume the user `dart` owns.
# BASE: the official image; scripts/build_images.sh passes a Debian-made one (docs/images.md).
ARG BASE=python:3.11.11-slim-bookworm
FROM ${BASE}
ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 HOME=/home/dart XDG_CACHE_HOME=/cache \
    VLLM_CACHE_ROOT=/cache/vllm TRITON_CACHE_DIR=/cache/triton FLASHINFER_WORKSPACE_BASE=/cache/flashinfer \
    HF_HOME=/cache/huggingface JAX_COMPILATION_CACHE_DIR=/cache/jax
RUN apt-get -o DPkg::Lock::Timeout=300 update \
    && apt-get -o DPkg::Lock::Timeout=300 install -y --no-install-recommends build-essential \
    && rm -rf /var/lib/apt/lists/*
RUN useradd --create-home --uid 1000 --user-group dart && install -d -o dart -g dart /cache
WORKDIR /opt/dart-jax
COPY requirements/lock-gpu.txt lock.txt
# The dependencies first, a layer keyed on pyproject.toml and the lock alone (a change to the
# sources reuses it): the build backend, the project's and the extra's requirements, under the lock.
COPY pyproject.toml ./
RUN python3 -c 'import sys, tomllib; p = tomllib.load(open("pyproject.toml", "rb")); print(*p["build-system"]["requires"], *p["project"]["dependencies"], *p["project"]["optional-dependencies"][sys.argv[1]], sep="\n")' gpu > deps.txt \
    && pip install --constraint lock.txt --requirement deps.txt && rm deps.txt
COPY README.md ./
COPY dart_jax dart_jax
COPY rollout_gpu rollout_gpu
COPY envs envs
RUN pip install --no-index --no-deps --no-build-isolation .
VOLUME /cache
USER dart
