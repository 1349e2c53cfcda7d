"""`pytest --compiles N`: the N tests that spent the most time in XLA's compiler, in the
pytest processes (a trainer a test starts as a subprocess compiles in its own). Under xdist
each worker keeps its own account and hands it to the controller, which prints the sum.

Each backend compile JAX makes (a persistent-cache hit included, which costs a read) is
charged to the test running at the time, a module or session fixture's to the first test
that needed it; the summary lists each test's seconds, compiles, cache hits and its
costliest programs, so that tests building the same program can be made to share it.
"""

from __future__ import annotations

import collections
import dataclasses

import pytest

_COMPILE = "/jax/core/compile/backend_compile_duration"
_HIT = "/jax/compilation_cache/cache_hits"


@dataclasses.dataclass
class _Charge:
    seconds: float = 0.0
    compiles: int = 0
    hits: int = 0
    programs: collections.Counter = dataclasses.field(default_factory=collections.Counter)


class _Report:
    def __init__(self, top: int):
        self.top = top
        self.current = "(collection)"
        self.charges: dict[str, _Charge] = collections.defaultdict(_Charge)

    def to_wire(self) -> dict:
        """The account as plain data (what an xdist worker can hand back)."""
        return {nodeid: [c.seconds, c.compiles, c.hits, dict(c.programs)] for nodeid, c in self.charges.items()}

    def add(self, wire: dict) -> None:
        for nodeid, (seconds, compiles, hits, programs) in wire.items():
            charge = self.charges[nodeid]
            charge.seconds += seconds
            charge.compiles += compiles
            charge.hits += hits
            charge.programs.update(programs)

    def listen(self) -> None:
        from jax import monitoring
        monitoring.register_event_duration_secs_listener(self.on_duration)
        monitoring.register_event_listener(self.on_event)

    def stop(self) -> None:
        from jax import monitoring
        monitoring.unregister_event_duration_listener(self.on_duration)
        monitoring.unregister_event_listener(self.on_event)

    def on_duration(self, event: str, seconds: float, **kw) -> None:
        if event == _COMPILE:
            charge = self.charges[self.current]
            charge.seconds += seconds
            charge.compiles += 1
            charge.programs[kw.get("fun_name", "?")] += seconds

    def on_event(self, event: str, **kw) -> None:
        if event == _HIT:
            self.charges[self.current].hits += 1

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        self.current = item.nodeid
        yield

    def pytest_sessionfinish(self, session):
        if hasattr(session.config, "workeroutput"):  # an xdist worker: the controller prints
            session.config.workeroutput["compiles"] = self.to_wire()

    def pytest_testnodedown(self, node, error):  # the xdist controller: a worker's account
        self.add(getattr(node, "workeroutput", {}).get("compiles", {}))

    def pytest_terminal_summary(self, terminalreporter):
        write = terminalreporter.write_line
        total = sum(c.seconds for c in self.charges.values())
        terminalreporter.section(f"XLA compile time: {total:.1f} s in the pytest processes, top {self.top} tests")
        ranked = sorted(self.charges.items(), key=lambda kv: -kv[1].seconds)[:self.top]
        for nodeid, c in ranked:
            programs = ", ".join(f"{name} {s:.1f}" for name, s in c.programs.most_common(3))
            write(f"{c.seconds:7.1f} s {c.compiles:4d} compiles {c.hits:3d} cache hits  {nodeid}  [{programs}]")


def pytest_addoption(parser):
    parser.addoption("--compiles", type=int, default=0, metavar="N",
                     help="list the N tests that spent the most time compiling XLA programs")


def _xdist_controller(config) -> bool:
    return config.getoption("dist", default="no") != "no" and not hasattr(config, "workerinput")


def pytest_configure(config):
    top = config.getoption("--compiles")
    if top > 0:
        report = _Report(top)
        if not _xdist_controller(config):  # which runs no test
            report.listen()
        config.pluginmanager.register(report, "compile-report")
