"""Install boundaries: each host imports only its own stack.

A TPU host has no torch or vLLM, a GPU rollout host needs no JAX, an env host needs
neither, and neither it nor the data manager needs tokenizers. Each check imports every module of the packages in a fresh interpreter and lists
the forbidden stacks that got loaded.
"""

import json
import subprocess
import sys

import pytest

_PROBE = """
import importlib, json, pkgutil, sys
for name in {packages!r}:
    mod = importlib.import_module(name)
    for info in pkgutil.walk_packages(getattr(mod, "__path__", []), name + "."):
        importlib.import_module(info.name)
print(json.dumps(sorted({{m.split(".")[0] for m in sys.modules}} & {forbidden!r})))
"""


def loaded_forbidden(packages: list[str], forbidden: set[str]) -> list[str]:
    code = _PROBE.format(packages=packages, forbidden=forbidden)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("packages, forbidden", [
    (["rollout_gpu", "dart_jax.wire"], {"jax", "jaxlib", "flax"}),
    (["dart_jax.wire", "dart_jax.config", "dart_jax.rundir", "dart_jax.logs"],
     {"jax", "flax", "torch", "vllm", "transformers"}),
    # the env and data-manager images (core, envs) install no tokenizers: their config loads without it
    (["envs"], {"jax", "flax", "torch", "vllm", "tokenizers"}),
    (["dart_jax.data", "dart_jax.run.schema"], {"jax", "flax", "torch", "vllm", "tokenizers"}),
    (["dart_jax.train", "dart_jax.models", "dart_jax.policy"], {"torch", "vllm"}),
])
def test_role_imports_stay_in_their_stack(packages, forbidden):
    assert loaded_forbidden(packages, forbidden) == []
