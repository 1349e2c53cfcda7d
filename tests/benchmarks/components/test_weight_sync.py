"""benchmarks.components.weight_sync's figures over many updates: nearest-rank percentiles
(benchmarks.common) and the longest token gap of a window (the benchmark itself starts vLLM:
a command, not a test)."""

import pytest

from benchmarks.common import spread
from benchmarks.components.weight_sync import longest_gap


def test_percentiles_are_nearest_rank_over_the_updates():
    ten = [0.10, 0.30, 0.12, 0.11, 0.50, 0.13, 0.14, 0.16, 0.15, 0.17]
    assert spread(ten) == {"p50": 0.14, "p95": 0.50, "max": 0.50}  # p95 of 10 is the 10th
    twenty = [i / 100 for i in range(1, 21)]
    assert spread(twenty) == {"p50": 0.10, "p95": 0.19, "max": 0.20}
    assert spread([0.2]) == {"p50": 0.2, "p95": 0.2, "max": 0.2}


def test_the_longest_gap_counts_the_window_edges_and_ignores_tokens_outside():
    arrivals = [0.5, 1.0, 1.1, 2.0, 2.05, 9.0]
    assert longest_gap(arrivals, 1.0, 2.05) == pytest.approx(0.9)  # 1.1 -> 2.0
    assert longest_gap(arrivals, 0.0, 1.0) == pytest.approx(0.5)  # from the window's start
    assert longest_gap(arrivals, 2.05, 5.0) == pytest.approx(2.95)  # to its end: 9.0 lies outside
