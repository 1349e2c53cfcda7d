#!/usr/bin/env bash
# Idempotent install for one kind of host into .venv-KIND (the local CPU platform is
# scripts/setup.sh). KIND is one of:
#   tpu      trainer on a TPU VM: jax[tpu], flax, optax, orbax, grain; no torch, no vLLM
#   gpu      trainer on JAX CUDA plus vLLM rollout workers
#   rollout  vLLM rollout workers only (no JAX)
#   envs     env server hosts: MiniWoB++ (needs chromium), synthetic suite
# Usage: scripts/setup_host.sh KIND   (PYTHON=python3.12 to pick the interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:?usage: scripts/setup_host.sh tpu|gpu|rollout|envs}
case "$kind" in tpu|gpu|rollout|envs) ;; *) echo "unknown host kind: $kind" >&2; exit 2;; esac
VENV=.venv-$kind
STAMP=$VENV/.dart-jax-setup
want=$(cat scripts/setup_host.sh pyproject.toml | sha256sum | cut -d' ' -f1)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  echo "setup_host: $kind up to date ($VENV)"; exit 0
fi
"${PYTHON:-python3}" -c 'import sys; assert sys.version_info >= (3, 11), "dart-jax needs Python >= 3.11"'
[ -x $VENV/bin/python ] || "${PYTHON:-python3}" -m venv $VENV
$VENV/bin/python -m pip install -q --upgrade pip
$VENV/bin/python -m pip install -q -e ".[$kind]"
echo "$want" > "$STAMP"
echo "setup_host: $kind installed into $VENV"
