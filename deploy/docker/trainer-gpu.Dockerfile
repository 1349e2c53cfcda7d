# dart-jax-gpu: the trainer on GPU hosts: jax[cuda12] (its CUDA libraries from the registry's
# wheels; the node gives the driver), and vLLM for a rollout worker on the same box.
#   docker build -f deploy/docker/trainer-gpu.Dockerfile -t dart-jax-gpu .     (from the repository root)
FROM python:3.11.11-slim-bookworm
ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1
WORKDIR /opt/dart-jax
COPY requirements/lock-cpu.txt lock.txt
COPY pyproject.toml README.md ./
COPY dart_jax dart_jax
COPY rollout_gpu rollout_gpu
COPY envs envs
RUN pip install --constraint lock.txt ".[gpu]"
USER 1000
