# dart-jax-envs: an env server host (MiniWoB++ in Debian's Chromium, the synthetic suite): no JAX, no torch.
#   docker build -f deploy/docker/envs.Dockerfile -t dart-jax-envs .     (from the repository root)
# BASE: the official image; scripts/build_images.sh passes a Debian-made one (docs/images.md).
ARG BASE=python:3.11.11-slim-bookworm
FROM ${BASE}
ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 HOME=/home/dart XDG_CACHE_HOME=/home/dart/.cache \
    MINIWOB_CHROME_BINARY=/usr/bin/chromium MINIWOB_CHROMEDRIVER=/usr/bin/chromedriver
RUN apt-get update && apt-get install -y --no-install-recommends chromium chromium-driver \
    && rm -rf /var/lib/apt/lists/*
RUN useradd --create-home --uid 1000 --user-group dart
WORKDIR /opt/dart-jax
COPY requirements/lock-cpu.txt lock.txt
# The dependencies first, a layer keyed on pyproject.toml and the lock alone (a change to the
# sources reuses it): the build backend, the project's and the extra's requirements, under the lock.
COPY pyproject.toml ./
RUN python3 -c 'import sys, tomllib; p = tomllib.load(open("pyproject.toml", "rb")); print(*p["build-system"]["requires"], *p["project"]["dependencies"], *p["project"]["optional-dependencies"][sys.argv[1]], sep="\n")' envs > deps.txt \
    && pip install --constraint lock.txt --requirement deps.txt && rm deps.txt
COPY README.md ./
COPY dart_jax dart_jax
COPY rollout_gpu rollout_gpu
COPY envs envs
RUN pip install --no-index --no-deps --no-build-isolation .
USER dart
