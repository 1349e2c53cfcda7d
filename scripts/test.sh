#!/usr/bin/env bash
# The default suite: every test this machine can run (vllm and browser included); tests
# whose marker needs absent hardware (gpu, tpu, osworld) are skipped and listed (-ra).
set -uo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
# what `make test` installed must be there: a test that would skip for want of it stops the run
export DART_MAKE_TEST=1
.venv/bin/python -m pytest -ra --durations=40 "$@"
rc=$?
echo "make test: pytest exit $rc after $(( $(date +%s) - start )) s"
# 5 = no tests collected: an empty run is a failure, never a silent pass.
exit $rc
