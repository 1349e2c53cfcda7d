#!/usr/bin/env bash
# dart-jax on one host of the slice (written by `dart-jax tpu submit`; idempotent): run it as
# `bash install.sh` in the directory it lies in, beside the wheel and its lock.
set -euo pipefail
cd "$(dirname "$0")"
# the shared run root (nfs), the same directory on every host
command -v mount.nfs >/dev/null || { sudo apt-get -o DPkg::Lock::Timeout=300 update -q && sudo apt-get -o DPkg::Lock::Timeout=300 install -yq nfs-common; }
mountpoint -q /mnt/runs || { sudo mkdir -p /mnt/runs && sudo mount -t nfs -o rw,hard 10.0.0.2:/runs /mnt/runs; }
# every host's user writes the share through group 2000
getent group 2000 >/dev/null || sudo groupadd -g 2000 dart-jax
sudo usermod -aG "$(getent group 2000 | cut -d: -f1)" "${USER:-$(id -un)}"
sudo chgrp 2000 /mnt/runs && sudo chmod 2775 /mnt/runs
# uv from the registry brings a Python of its own (TPU VM images have 3.10)
if command -v uv >/dev/null; then UV=$(command -v uv)
else python3 -m pip install --user --quiet "uv==0.13.8"; UV="$HOME/.local/bin/uv"; fi
"$UV" venv --quiet --allow-existing --python "${DART_PYTHON:-3.11}" .venv
if [ -n "${DART_DEPS_FROM:-}" ]; then
  echo "$DART_DEPS_FROM" > "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/dart-deps.pth"
  "$UV" pip install --quiet --python .venv/bin/python --no-deps --reinstall ./dart_jax-0.1.0-py3-none-any.whl
else
  "$UV" pip install --quiet --python .venv/bin/python --constraint lock.txt --reinstall-package dart-jax "./dart_jax-0.1.0-py3-none-any.whl[tpu]"
fi
.venv/bin/dart-jax --help >/dev/null
PATH="$PWD/.venv/bin:$(dirname "$UV"):$PATH" bash -c 'uv pip install --quiet --python .venv/bin/python huggingface_hub && hf download ByteDance-Seed/UI-TARS-1.5-7B --local-dir UI-TARS-1.5-7B'
echo "dart-jax installed in $PWD/.venv"
