#!/usr/bin/env bash
# The default suite: every test this machine can run (vllm and browser included); tests
# whose marker needs absent hardware (gpu, tpu, osworld) are skipped and listed (-ra).
set -uo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
# what `make test` installed must be there: a test that would skip for want of it stops the run
export DART_MAKE_TEST=1
# Two workers (DART_TEST_WORKERS=N for more, 0 for one process): one runs the tests that start
# engines, browsers, VMs and hosts, in order; the other the rest (tests/conftest.py). That group
# bounds the wall time whatever the count (more workers not measured here).
.venv/bin/python -m pytest -ra --durations=40 -n "${DART_TEST_WORKERS:-2}" --dist loadgroup --no-loadscope-reorder "$@"
rc=$?
echo "make test: pytest exit $rc after $(( $(date +%s) - start )) s"
# 5 = no tests collected: an empty run is a failure, never a silent pass.
exit $rc
