"""The async-vs-sync benchmark's window: the rounds after the warm-up, each whole."""

import pytest

from benchmarks.experiments.async_vs_sync import steady_window
from dart_jax.observe.records import TrainerRound
from dart_jax.observe.utilization import trained_in


def _round(step: int, fetch: float, publish_end: float) -> TrainerRound:
    return TrainerRound(step=step, policy_version=step, batch_id=step, fetch_start=fetch,
                        update_start=fetch + 1, publish_start=publish_end - 0.5, publish_end=publish_end)


ROUNDS = [_round(3, 70.0, 90.0), _round(1, 0.0, 40.0), _round(2, 40.0, 70.0)]  # any order


def test_window_starts_after_the_warmup_rounds():
    w = steady_window(ROUNDS, 1)
    assert (w.start, w.end) == (40.0, 90.0)
    assert [r.step for r in ROUNDS if w.start <= r.publish_start < w.end] == [3, 2]
    assert (steady_window(ROUNDS, 0).start, steady_window(ROUNDS, 2).start) == (0.0, 70.0)


def test_window_counts_exactly_the_rounds_after_warmup():
    class Batch:
        def __init__(self, i):
            self.batch_id, self.steps, self.staleness = i, 10, []

    w = steady_window(ROUNDS, 2)
    assert [b.batch_id for b in trained_in(ROUNDS, [Batch(i) for i in (1, 2, 3)], w)] == [3]


def test_no_round_after_warmup_is_refused():
    with pytest.raises(ValueError, match="none after the 3 warm-up rounds"):
        steady_window(ROUNDS, 3)
