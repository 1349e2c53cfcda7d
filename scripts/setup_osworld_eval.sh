#!/usr/bin/env bash
# desktop-env's own environment for OSWorld's evaluator sidecar (envs/osworld/sidecar.py):
# .venv-osworld-eval with desktop-env and its declared pins (torch 2.5, numpy < 2,
# transformers 4.35, easyocr), which cannot share .venv. About 6.6 GB and 3-4 min here;
# not made by `make test`. A stamp keyed on this script makes a re-run take a second.
#   PYTHON=python3.11 scripts/setup_osworld_eval.sh
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-osworld-eval
STAMP=$VENV/.dart-jax-osworld-eval
DESKTOP_ENV=desktop-env==1.0.2
UV=${UV:-$(command -v uv || echo .venv/bin/uv)}
want=$(sha256sum scripts/setup_osworld_eval.sh | cut -d' ' -f1)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  echo "setup-osworld-eval: up to date ($VENV)"
  exit 0
fi
start=$(date +%s)
"$UV" venv -q --clear -p "${PYTHON:-python3.11}" "$VENV"
"$UV" pip install -q -p "$VENV/bin/python" "$DESKTOP_ENV"
"$VENV/bin/python" -c 'import desktop_env.evaluators.metrics, desktop_env.evaluators.getters'
echo "$want" > "$STAMP"
echo "setup-osworld-eval: $VENV ready in $(( $(date +%s) - start )) s ($(du -sh "$VENV" | cut -f1))"
