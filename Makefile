# dart-jax: `make run` runs the local default job, `make test` the whole default suite.
# Both install what they need first (scripts/setup.sh is idempotent: seconds when done).
PY := .venv/bin/python
CONFIG ?= configs/local.yaml
RUN_NAME ?= local-$(shell date +%Y%m%d-%H%M%S)
PYTEST_ARGS ?=

.PHONY: setup setup-vm setup-vm-osworld setup-osworld-eval images test test-fast run clean

setup:
	@bash scripts/setup.sh

# The desktop VM image (QEMU, mmdebstrap, a Debian desktop with OSWorld's in-VM server):
# about 3-7 min the first time, cached under ~/.cache/dart-jax/vm by its sources' hash.
# An explicit rule: it wins over the setup-% pattern below.
setup-vm: setup
	@bash scripts/build_vm_image.sh

# The `osworld` image: the desktop image plus OSWorld's applications from Debian
# (scripts/vm_image/); much larger, and not built by `make test`.
setup-vm-osworld: setup
	@bash scripts/build_vm_image.sh osworld

# The CPU role images (podman on a Debian base made with mmdebstrap; docs/images.md): about
# 10 min the first time, then seconds: each is tagged and recorded by its sources' hash.
images:
	@bash scripts/build_images.sh

# desktop-env's own environment for OSWorld's evaluator sidecar (envs/osworld/sidecar.py):
# .venv-osworld-eval, about 6.6 GB; not made by `make test` (its tests are then skipped).
setup-osworld-eval: setup
	@bash scripts/setup_osworld_eval.sh

test: setup setup-vm images
	@bash scripts/test.sh $(PYTEST_ARGS)

test-fast: setup
	@bash scripts/test.sh -m "not slow and not vm" $(PYTEST_ARGS)

run: setup
	$(PY) -m dart_jax.cli run $(CONFIG) run.name=$(RUN_NAME) $(ARGS)

clean:
	rm -rf runs .pytest_cache

# Other hosts (see BUILD.md): the TPU trainer, GPU trainer + vLLM, rollout-only, env hosts.
setup-%:
	@bash scripts/setup_host.sh $*
