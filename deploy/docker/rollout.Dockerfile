# dart-jax-rollout: a GPU rollout worker (vLLM's CUDA build of the release whose CPU build is
# tested, its torch and CUDA libraries from the registry's wheels; the node gives the driver): no JAX.
#   docker build -f deploy/docker/rollout.Dockerfile -t dart-jax-rollout .     (from the repository root)
FROM python:3.11.11-slim-bookworm
ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1
WORKDIR /opt/dart-jax
COPY requirements/lock-cpu.txt lock.txt
COPY pyproject.toml README.md ./
COPY dart_jax dart_jax
COPY rollout_gpu rollout_gpu
COPY envs envs
RUN pip install --constraint lock.txt ".[rollout]"
USER 1000
