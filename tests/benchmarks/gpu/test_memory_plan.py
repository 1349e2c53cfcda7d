"""What XLA's plan holds: allocations by kind and the largest values, from its buffer assignment."""

import os

from benchmarks.gpu import memory_plan

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
