"""`pytest --compiles N` (tests/compile_report.py) hears JAX's compile events: a fresh
program's compile is charged to the test running, with its name."""

import jax
import jax.numpy as jnp

from tests.compile_report import _Report


def test_a_compile_is_charged_to_the_running_test_by_program_name():
    report = _Report(top=1)
    report.current = "tests/x.py::test_y"
    report.listen()
    try:
        def compile_report_probe(x):
            return jnp.sin(x) * 3.0 + x.shape[0]
        jax.jit(compile_report_probe)(jnp.arange(7.0)).block_until_ready()
    finally:
        report.stop()
    charge = report.charges["tests/x.py::test_y"]
    assert charge.compiles >= 1 and charge.seconds > 0
    assert any("compile_report_probe" in name for name in charge.programs), charge.programs


def test_workers_accounts_add_up_in_the_controller():
    """Under xdist each worker hands its account over as plain data; the controller sums them."""
    worker = _Report(top=1)
    worker.current = "tests/x.py::test_y"
    worker.on_duration("/jax/core/compile/backend_compile_duration", 2.5, fun_name="train_accumulate")
    worker.on_event("/jax/compilation_cache/cache_hits")
    controller = _Report(top=1)
    controller.add(worker.to_wire())
    controller.add(worker.to_wire())
    charge = controller.charges["tests/x.py::test_y"]
    assert (charge.seconds, charge.compiles, charge.hits) == (5.0, 2, 2)
    assert charge.programs == {"train_accumulate": 5.0}
