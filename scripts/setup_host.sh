#!/usr/bin/env bash
# Idempotent install for one kind of host into .venv-KIND, under that host kind's lock (the
# local CPU platform is scripts/setup.sh). KIND is one of:
#   tpu      trainer on a TPU VM: jax[tpu], flax, optax, orbax, grain; no torch, no vLLM
#            (requirements/lock-tpu.txt, Python 3.11)
#   gpu      trainer on JAX CUDA plus vLLM rollout workers (requirements/lock-gpu.txt; Python
#            3.12: lock-gpu-py3.12.txt); checks the driver and a C compiler first
#   rollout  vLLM rollout workers only, no JAX (the GPU lock; the same checks)
#   envs     env server hosts: MiniWoB++ (needs chromium), synthetic suite (requirements/lock-cpu.txt)
# Usage: scripts/setup_host.sh KIND   (PYTHON=python3.12 to pick the interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:?usage: scripts/setup_host.sh tpu|gpu|rollout|envs}
PY=${PYTHON:-python3}
case "$kind" in tpu|gpu|rollout|envs) ;; *) echo "unknown host kind: $kind" >&2; exit 2;; esac
python=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
case "$kind/$python" in
  tpu/3.11) LOCK=requirements/lock-tpu.txt ;;
  gpu/3.11|rollout/3.11) LOCK=requirements/lock-gpu.txt ;;
  gpu/3.12|rollout/3.12) LOCK=requirements/lock-gpu-py3.12.txt ;;
  envs/3.11) LOCK=requirements/lock-cpu.txt ;;
  *) echo "setup_host: no lock for $kind hosts on Python $python (see requirements/; PYTHON=python3.11)" >&2; exit 2 ;;
esac
case "$kind" in gpu|rollout) bash scripts/check_gpu_host.sh ;; esac
VENV=.venv-$kind
STAMP=$VENV/.dart-jax-setup
want=$(cat scripts/setup_host.sh pyproject.toml "$LOCK" | sha256sum | cut -d' ' -f1)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  echo "setup_host: $kind up to date ($VENV)"; exit 0
fi
[ -x $VENV/bin/python ] || "$PY" -m venv $VENV
$VENV/bin/python -m pip install -q --upgrade pip
$VENV/bin/python -m pip install -q --constraint "$LOCK" -e ".[$kind]"
echo "$want" > "$STAMP"
echo "setup_host: $kind installed into $VENV under $LOCK"
