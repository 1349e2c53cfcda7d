#!/usr/bin/env bash
# Wheels the GPU suite needs on a lent GPU machine, which has no package registry: msgspec and
# pyzmq (the train step's JAX workers import the trainer's batch types, which import the wire
# module), at the versions of requirements/lock-cpu.txt, built for that machine's Python
# (CPython 3.12, x86-64 manylinux; neither is pure Python), into .whl/: ignored by git, named
# in the device call's `carry`. docs/benchmarks.md ("GPU figures: the prepared suite") has the call.
set -euo pipefail
cd "$(dirname "$0")/.."
exclude="$(git rev-parse --git-common-dir)/info/exclude"
grep -qxF '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >>"$exclude"
pins=$(grep -iE '^(msgspec|pyzmq)==' requirements/lock-cpu.txt)
mkdir -p .whl
rm -f .whl/msgspec-*.whl .whl/pyzmq-*.whl  # one version of each: two stop the install there
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_26_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64; do
  platforms+=(--platform "$p")
done
# shellcheck disable=SC2086  # $pins is one requirement a word
PIP_CONFIG_FILE=/dev/null "${PY:-.venv/bin/python}" -m pip download -q --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation cp "${platforms[@]}" -d .whl $pins
ls -l .whl
