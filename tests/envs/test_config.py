"""Env server config from plain data, and the env-host import rule (no JAX, no torch)."""

import subprocess
import sys

import pytest

from dart_jax.config import ConfigError, from_dict
from envs.config import EnvServerConfig, MiniWoBSlots, SyntheticSlots


def test_slots_are_variants_chosen_by_type():
    cfg = from_dict(EnvServerConfig, {"slots": [{"type": "miniwob", "count": 2},
                                                {"type": "synthetic", "count": 16, "difficulty": 2}],
                                      "invalid_action": "end", "image": {"max_pixels": 1_000_000}})
    assert cfg.slots == (MiniWoBSlots(count=2), SyntheticSlots(count=16, difficulty=2))
    assert cfg.wire.endpoint == "tcp://127.0.0.1:5555" and cfg.image.max_pixels == 1_000_000


@pytest.mark.parametrize("data, key", [
    ({"slots": [{"type": "vnc"}]}, "slots[0].type"), ({"slots": [{"type": "synthetic", "count": 0}]}, "count"),
    ({"invalid_action": "ignore"}, "invalid_action"), ({"lease_s": 0}, "lease_s"), ({"slots": []}, "at least one slot"),
    ({"slots": [{"type": "miniwob", "colour": 1}]}, "colour")])
def test_bad_configs_name_the_key(data, key):
    with pytest.raises(ConfigError, match=key.replace("[", r"\[").replace("]", r"\]")):
        from_dict(EnvServerConfig, data)


def test_env_hosts_never_import_jax_or_torch():
    code = ("import sys, envs.server, envs.miniwob_env, envs.osworld.env, envs.oracle; "
            "print(sorted(m for m in ('jax', 'torch', 'flax', 'vllm') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
