"""The gain statistics on hand-written outcomes, every number computed by hand."""

import json
import math

import pytest

from dart_jax.eval.stats import Outcome, paired_gain, report
from dart_jax.rundir import RunDir
from dart_jax.run.main import gain

T2 = 4.302652729749462  # Student t, 2 degrees of freedom, 0.975 quantile (tables: 4.303)


def _outcomes(table: dict[str, list[int]], mode: str = "sampled") -> list[Outcome]:
    return [Outcome(task, mode, i, bool(s), float(s), 1, "success" if s else "failure")
            for task, wins in table.items() for i, s in enumerate(wins)]


BEFORE = {"a": [0, 0], "b": [0, 1], "c": [1, 1]}
AFTER = {"a": [1, 1], "b": [1, 1], "c": [1, 0]}
# differences by task: a [+1, +1] (sum 2), b [+1, 0] (sum 1), c [0, -1] (sum -1); 6 pairs
# gain = 2 / 6 = 1/3
# se² = 3/2 · ((2 - 2/3)² + (1 - 2/3)² + (-1 - 2/3)²) / 6² = 3/2 · (16 + 1 + 25)/9 / 36 = 7/36
# half = t_2 · sqrt(7/36)


def test_clustered_gain_by_hand():
    g = paired_gain(_outcomes(BEFORE), _outcomes(AFTER))
    half = T2 * math.sqrt(7 / 36)
    assert g["n"] == 6 and g["clusters"] == 3
    assert g["gain"] == pytest.approx(1 / 3)
    assert g["ci95"] == pytest.approx([1 / 3 - half, 1 / 3 + half])
    # the six pairs taken as independent draws would give 1.96 · (2/3)^0.5 / 6^0.5 = 0.653: too narrow
    assert half > 1.96 * math.sqrt(2 / 3) / math.sqrt(6) * 2


def test_equal_clusters_are_a_t_interval_on_the_task_means():
    """Task means 1, 0.5, -0.5: mean 1/3, sd sqrt(((2/3)² + (1/6)² + (5/6)²) / 2) = sqrt(7/12),
    half = t_2 · sd / sqrt(3) = t_2 · sqrt(7/36): the same as the cluster-robust form."""
    g = paired_gain(_outcomes(BEFORE), _outcomes(AFTER))
    assert g["ci95"][1] - g["gain"] == pytest.approx(T2 * math.sqrt(7 / 12) / math.sqrt(3))


def test_unpaired_episodes_and_modes():
    """Episodes only one side played are left out; greedy and sampled episodes of a task are
    separate clusters. Task a sampled [+1, +1], a greedy [-1], b sampled [0] (b's second
    sample unplayed before): sums 2, -1, 0 over 2, 1, 1 pairs; gain 1/4;
    se² = 3/2 · ((2 - 1/2)² + (-1 - 1/4)² + (0 - 1/4)²) / 16 = 3/2 · (2.25 + 1.5625 + 0.0625) / 16."""
    before = _outcomes({"a": [0, 0], "b": [1]}) + _outcomes({"a": [1]}, "greedy")
    after = _outcomes({"a": [1, 1], "b": [1, 0]}) + _outcomes({"a": [0]}, "greedy")
    g = paired_gain(before, after)
    assert (g["n"], g["clusters"]) == (4, 3) and g["gain"] == pytest.approx(0.25)
    half = T2 * math.sqrt(1.5 * 3.875 / 16)
    assert g["ci95"] == pytest.approx([0.25 - half, 0.25 + half])


def test_no_interval_from_nothing_or_one_task():
    with pytest.raises(ValueError, match="share no episode"):
        paired_gain(_outcomes({"a": [1]}), _outcomes({"b": [1]}))
    with pytest.raises(ValueError, match="two tasks"):
        paired_gain(_outcomes({"a": [0, 0]}), _outcomes({"a": [1, 1]}))


def test_the_run_summarys_gain(tmp_path):
    """run.main.gain: the last evaluation over the first, sampled episodes only, clustered."""
    run = RunDir.create(tmp_path / "run")
    greedy_noise = _outcomes({"a": [1], "b": [1], "c": [1]}, "greedy")
    for label, table in (("sft", BEFORE), ("rl", AFTER)):
        path = run.root / "eval" / f"{label}.json"
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(report(label, tmp_path, _outcomes(table) + greedy_noise)))
    got = gain(run, ["sft", "rl"])
    half = T2 * math.sqrt(7 / 36)
    assert got["heldout_gain"] == pytest.approx(1 / 3) and (got["heldout_pairs"], got["heldout_tasks"]) == (6, 3)
    assert got["heldout_gain_ci95"] == pytest.approx([1 / 3 - half, 1 / 3 + half])
    assert gain(run, ["sft"]) == {}
