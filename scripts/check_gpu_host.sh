#!/usr/bin/env bash
# What a GPU host (trainer or rollout worker) needs beside the Python packages, checked before
# anything is installed, one line each when it is missing:
#   an NVIDIA driver of R580 or newer (the GPU lock's torch, vLLM and JAX are built on CUDA 13);
#   a C compiler (Triton compiles its driver stub at first use; FlashInfer's JIT needs nvcc's
#   host compiler).
# Usage: scripts/check_gpu_host.sh     (scripts/setup_host.sh gpu|rollout runs it first)
set -euo pipefail
FLOOR=580
if ! command -v nvidia-smi >/dev/null; then
  echo "check_gpu_host: no NVIDIA driver (nvidia-smi not found): CUDA 13 needs driver R$FLOOR or newer" >&2
  exit 1
fi
driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n1 | tr -d ' ')
if ! [[ "${driver%%.*}" =~ ^[0-9]+$ ]] || [ "${driver%%.*}" -lt "$FLOOR" ]; then
  echo "check_gpu_host: NVIDIA driver ${driver:-unknown} is older than R$FLOOR, which CUDA 13 needs: upgrade the driver" >&2
  exit 1
fi
if ! compiler=$(command -v cc || command -v gcc); then
  echo "check_gpu_host: no C compiler (Triton and FlashInfer compile kernels at first use): apt-get install build-essential" >&2
  exit 1
fi
echo "check_gpu_host: driver $driver (R$FLOOR or newer), C compiler $compiler"
