"""Where a step's time goes: operations summed by their own time, and sorted into kinds."""

from types import SimpleNamespace as NS

import jax
import jax.numpy as jnp
import pytest

from benchmarks.gpu.op_profile import _xla_op_times, jax_ops, kind, summarize, torch_ops


def event(op: str | None, start: int, duration: int, name: str = "") -> NS:
    stats = [("hlo_op", op)] if op is not None else []
    return NS(start_ns=start, duration_ns=duration, name=name or (op or "host"), stats=stats)


def plane(name: str, *lines) -> NS:
    return NS(name=name, lines=[NS(name=line_name, events=events) for line_name, events in lines])


def test_kernel_names_sort_into_kinds():
    assert kind("custom-call.3", "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n") == "matmul"
    assert kind("custom-call.9", "cudnn_generated_fort_native_sdpa_sm90_flash_fprop") == "attention"
    assert kind("all-reduce.1", "ncclDevKernel_AllReduce_Sum_f32_RING_LL") == "collective"
    assert kind("copy.4", "") == "copy" and kind("loop_multiply_fusion.2", "") == "other"
    assert kind("aten::mm") == "matmul" and kind("aten::_scaled_dot_product_flash_attention_for_cpu") == "attention"


def test_an_operation_that_holds_others_counts_only_its_own_time():
    loop = [event("while.1", 0, 100), event("fusion.2", 10, 30), event("dot.3", 50, 40), event(None, 0, 500)]
    profile = NS(planes=[plane("/host:CPU", ("xla", loop))])
    times, counts, _ = _xla_op_times(profile)
    assert times == pytest.approx({"while.1": 30e-9, "fusion.2": 30e-9, "dot.3": 40e-9})
    assert sum(times.values()) == pytest.approx(100e-9)  # the loop's wall time, once
    assert counts == {"while.1": 1, "fusion.2": 1, "dot.3": 1}


def test_a_device_plane_is_read_before_the_host_and_its_ops_line_alone():
    gpu = plane("/device:GPU:0", ("Stream #1", [event("fusion.2", 0, 10, "loop_fusion")]),
                ("XLA Ops", [event("fusion.2", 0, 10, "fusion.2"), event("custom-call.1", 20, 50, "sm90_xmma_gemm")]),
                ("XLA Modules", [event(None, 0, 70, "jit_step")]))
    host = plane("/host:CPU", ("xla", [event("fusion.9", 0, 1000)]))
    times, counts, kernels = _xla_op_times(NS(planes=[host, gpu]))
    assert times == pytest.approx({"fusion.2": 10e-9, "custom-call.1": 50e-9})  # not twice, not the host's
    assert kernels["custom-call.1"] == "sm90_xmma_gemm"


def test_device_kernels_without_their_operation_count_by_kernel_name():
    gpu = plane("/device:GPU:0", ("Stream #7(compute)", [event(None, 0, 40, "sm90_xmma_gemm_bf16"),
                                                          event(None, 50, 10, "loop_add_fusion")]),
                ("XLA Modules", [event(None, 0, 60, "jit_step")]))
    times, _, _ = _xla_op_times(NS(planes=[gpu, plane("/host:CPU", ("python", [event(None, 0, 99)]))]))
    assert times == pytest.approx({"sm90_xmma_gemm_bf16": 40e-9, "loop_add_fusion": 10e-9})


def test_the_summary_is_per_step_and_keeps_the_largest_operations():
    times = {f"op{i}": float(i) for i in range(1, 21)}
    doc = summarize(times, {op: 4 for op in times}, {}, steps=2, wall_s=420.0, source="test")
    assert doc["busy_s"] == pytest.approx(105.0) and doc["busy_share"] == pytest.approx(0.5)
    assert [t["op"] for t in doc["top"][:2]] == ["op20", "op19"] and len(doc["top"]) == 15
    assert doc["top"][0]["s"] == 10.0 and doc["top"][0]["calls"] == 2
    assert doc["by_kind_s"] == {"other": pytest.approx(105.0)}


def test_a_jitted_step_traced_on_this_cpu():
    a = jnp.ones((256, 256))
    f = jax.jit(lambda x: jnp.tanh(x @ x).sum())
    f(a).block_until_ready()
    doc = jax_ops(lambda: f(a).block_until_ready(), steps=3)
    assert doc["source"] == "/host:CPU" and doc["steps"] == 3
    assert doc["top"] and 0 < doc["busy_s"] <= doc["wall_s"] * 1.05


def test_a_torch_step_traced_on_this_cpu():
    import torch

    a = torch.ones(128, 128, requires_grad=True)

    def step():
        (a @ a).tanh().sum().backward()

    doc = torch_ops(step, steps=2)
    assert doc["source"] == "cpu ops" and doc["busy_s"] > 0
    assert doc["by_kind_s"].get("matmul", 0) > 0
