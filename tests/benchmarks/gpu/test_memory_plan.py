"""What XLA's plan holds: allocations by kind and the largest values, from its buffer assignment."""

import os
import subprocess
import sys
from pathlib import Path

from benchmarks.gpu import memory_plan

ROOT = Path(__file__).resolve().parents[3]
ASSIGNMENT = """BufferAssignment:
allocation 0: size 4096, parameter 0, shape |f32[32,32]| at ShapeIndex {}:
 value: <3 p0 @0> (size=4096,offset=0): f32[32,32]{1,0}
allocation 1: size 1024, maybe-live-out:
 value: <9 out @0> (size=1024,offset=0): f32[256]{0}
allocation 2: size 64, constant:
 value: <1 c @0> (size=64,offset=0): f32[16]{0}
allocation 3: size 9000, preallocated-temp:
 value: <5 fusion.1 @0> (size=8192,offset=0): bf16[64,64]{1,0}
 value: <6 dot.2 @0> (size=512,offset=8192): f32[128]{0}
 value: <7 copy.3 @0> (size=8192,offset=0): bf16[64,64]{1,0}

Total bytes used: 14184 (13.85KiB)
Used values:
<5 fusion.1 @0>
 positions:
  fusion.1
"""


def test_allocations_are_read_by_kind_and_values_by_size():
    plan = memory_plan.parse(ASSIGNMENT)
    assert (plan["temp_bytes"], plan["parameter_bytes"], plan["other_bytes"]) == (9000 + 1024, 4096, 64)
    assert [v["name"] for v in plan["largest_temps"]] == ["fusion.1", "copy.3", "out", "dot.2"]
    assert plan["largest_temps"][0] == {"name": "fusion.1", "shape": "bf16[64,64]{1,0}", "bytes": 8192}
    assert plan["largest_parameters"] == [{"name": "p0", "shape": "f32[32,32]{1,0}", "bytes": 4096}]


def test_the_module_with_the_most_working_memory_is_the_program(tmp_path):
    (tmp_path / "module_0001.jit_init.cpu_after_optimizations-buffer-assignment.txt").write_text(
        "allocation 0: size 10, preallocated-temp:\n value: <1 a @0> (size=10,offset=0): f32[2]{0}\n")
    (tmp_path / "module_0002.jit_step.cpu_after_optimizations-buffer-assignment.txt").write_text(ASSIGNMENT)
    (tmp_path / "module_0002.jit_step.cpu_after_optimizations.txt").write_text("HloModule jit_step")
    assert memory_plan.largest(tmp_path)["module"] == "module_0002.jit_step.cpu_after_optimizations"
    assert memory_plan.largest(tmp_path / "none") is None


def test_dumping_sets_xlas_flags_and_leaves_nothing_behind(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=1")
    with memory_plan.dumping() as dump:
        assert dump.is_dir() and f"--xla_dump_to={dump}" in os.environ["XLA_FLAGS"]
        assert os.environ["XLA_FLAGS"].startswith("--xla_force_host_platform_device_count=1 ")
    assert os.environ["XLA_FLAGS"] == "--xla_force_host_platform_device_count=1" and not dump.exists()


PLAN_OF_A_CACHED_PROGRAM = """
import sys
import jax, jax.numpy as jnp
from benchmarks.gpu import memory_plan

step = jax.jit(lambda x: (jnp.tanh(x) @ x.T).sum())
if sys.argv[1] == "fill":
    step(jnp.ones((64, 64))).block_until_ready()
else:
    with memory_plan.dumping() as dump:
        step.lower(jnp.ones((64, 64))).compile()
        print(memory_plan.largest(dump) is not None)
"""


def test_a_program_in_jaxs_compilation_cache_still_leaves_its_plan(tmp_path):
    """JAX's cache key ignores the dump flags: were the cache on while dumping, a program a
    previous process compiled would be loaded from it and XLA would write no plan."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "", "JAX_COMPILATION_CACHE_DIR": str(tmp_path),
           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}
    run = lambda what: subprocess.run([sys.executable, "-c", PLAN_OF_A_CACHED_PROGRAM, what], cwd=ROOT, env=env,  # noqa: E731
                                      capture_output=True, text=True, check=True).stdout.strip()
    run("fill")
    assert any(tmp_path.iterdir())  # the program is in the cache
    assert run("dump") == "True"
