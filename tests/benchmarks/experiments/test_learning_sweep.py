"""The learning sweep's logic at a tiny size: two runs whose stores hold hand-made training
rollouts (one that learns, one that collapses), each standing in for a `dart-jax run`, read
back through the run's own code (the store, the collapse rule in the summary, the low point),
judged against the bar and reported; the bar's edges by hand."""

import dataclasses
import json
from pathlib import Path

import pytest

from benchmarks.experiments import records
from benchmarks.experiments.learning_sweep import Bar, Row, report, row, seeds, sweep, table
from dart_jax.run.schema import RunConfig
from dart_jax.data.config import StoreConfig
from dart_jax.data.store import Store
from dart_jax.run.main import rollout_learning
from dart_jax.rundir import RunDir
from dart_jax.testing.trajectories import make_trajectory, put, task_specs


def summary(**kw) -> dict:
    return {"heldout_success_sft": 0.45, "heldout_success_rl": 0.70, "heldout_gain": 0.25,
            "heldout_gain_ci95": [0.15, 0.35], "rl_collapsed": False, "rl_collapsed_version": None,
            "rl_steps": 40, **kw}


def test_seeds_are_zero_to_n_or_fresh_or_one_seed_repeated():
    assert seeds(3, None) == [0, 1, 2]
    assert seeds(3, None, 6) == [6, 7, 8]
    assert seeds(3, 7) == [7, 7, 7]


@pytest.mark.parametrize("change,meets", [
    ({}, True),
    ({"heldout_gain": 0.20}, True),  # the bar's edge: gain >= 0.20
    ({"heldout_gain": 0.199}, False),
    ({"heldout_gain_ci95": [0.0, 0.3]}, False),  # the interval's low end must be above 0
    ({"heldout_success_sft": 0.70}, True),
    ({"heldout_success_sft": 0.71}, False),
    ({"heldout_success_sft": 0.04}, False),
    ({"rl_collapsed": True, "rl_collapsed_version": 30}, False),  # a collapse fails the bar (issue 42)
])
def test_the_bar(change, meets):
    assert row("r", 0, summary(**change), 0.4, 600.0).meets_bar is meets


def test_the_bar_counts_the_wall_time():
    assert row("r", 0, summary(), 0.4, 20 * 60 - 1).meets_bar
    assert not row("r", 0, summary(), 0.4, 20 * 60).meets_bar


def _fake_run(wins: list[bool], sft: float, gain: float):
    """A runner writing a run directory whose store holds rollouts with outcomes `wins` (64 a
    policy version), and returning the summary a run would, its collapse fields computed by
    the run's own code from that store."""
    def runner(config: Path, root: Path, name: str, seed: int, extra) -> tuple[dict, float]:
        run = RunDir.create(root / name, config_yaml="{}")
        cfg = RunConfig()
        store = Store.open(cfg.data.store, run.root)
        store.upsert_tasks(task_specs(4))
        put(store, *(make_trajectory(f"{name}-{i}", f"t{i % 4}", success=w, steps=1, version=i // 64)
                     for i, w in enumerate(wins)))
        store.close()
        learning = rollout_learning(cfg, run)
        return summary(heldout_success_sft=sft, heldout_success_rl=sft + gain, heldout_gain=gain,
                       heldout_gain_ci95=[gain - 0.08, gain + 0.08], **learning), 700.0 + seed
    return runner


def test_a_sweep_of_two_runs_reads_each_runs_curve_and_counts_the_bar(tmp_path, capsys):
    learns = [i % 2 == 0 for i in range(256)] + [i % 4 != 0 for i in range(256)]  # 0.5, then 0.75
    collapses = [True] * 256 + [False] * 256  # the window falls 35% at the 90th failure (version 5)
    runners = iter([_fake_run(learns, 0.45, 0.30), _fake_run(collapses, 0.45, 0.25)])
    rows = sweep(Path("configs/local.yaml"), tmp_path, [0, 1], [],
                 runner=lambda *a: next(runners)(*a), db_path=StoreConfig.db_path)
    first, second = rows
    assert (first.run, first.seed, first.wall_s, first.collapsed, first.meets_bar) == ("sweep-0-seed0", 0, 700.0,
                                                                                        False, True)
    # the first 256-window holds 128 wins (0.5, above the SFT level); the next drops a win and
    # adds the second half's first rollout, a loss (127 / 256); from there it only rises
    assert first.low_after_sft == 127 / 256
    assert (second.collapsed, second.collapsed_version) == (True, 5)
    assert second.low_after_sft == 0.0 and not second.meets_bar  # its held-out gain alone would pass
    printed = [json.loads(line)["sweep_run"] for line in capsys.readouterr().out.splitlines()]
    assert [p["run"] for p in printed] == ["sweep-0-seed0", "sweep-1-seed1"]  # one line as each run ends
    out = report(rows, Path("configs/local.yaml"), ["x=1"], tmp_path)
    assert (out["passed"], out["collapsed"], out["pass_rate"]) == (1, 1, 0.5)
    assert out["overrides"] == ["x=1"] and len(out["runs"]) == 2 and out["bar"] == {
        "min_gain": 0.2, "sft_range": (0.05, 0.7), "max_wall_s": 1200}
    json.dumps(out)
    text = table(rows).splitlines()
    assert text[-1] == "1 of 2 runs meet the bar; 1 collapsed"
    assert " v5 " in text[3] and " no " in text[2]


def test_a_run_that_never_reaches_its_sft_level_has_no_low_point():
    r = Row("r", 0, 0.5, 0.4, -0.1, (-0.2, 0.0), None, False, None, 10, 100.0, False)
    assert "never" in table([r]).splitlines()[2]
    assert Bar().max_wall_s == 1200


def test_a_recorded_run_is_read_back_not_run_and_another_bar_is_refused(tmp_path, capsys):
    ran: list[str] = []

    def runner(config, root, name, seed, extra):
        ran.append(name)
        return _fake_run([i % 2 == 0 for i in range(256)], 0.45, 0.30)(config, root, name, seed, extra)

    kept, config = tmp_path / "records", Path("configs/local.yaml")
    first = sweep(config, tmp_path / "a", [6], [], runner=runner, db_path=StoreConfig.db_path, kept=kept)
    assert ran == ["sweep-0-seed6"] and (kept / "sweep-0-seed6.json").is_file()
    # another sitting, a fresh machine: run 0 is read back, run 1 runs
    both = sweep(config, tmp_path / "b", [6, 7], [], runner=runner, db_path=StoreConfig.db_path, kept=kept)
    assert ran == ["sweep-0-seed6", "sweep-1-seed7"] and both[0] == first[0]
    assert not (tmp_path / "b" / "sweep-0-seed6").exists()
    with pytest.raises(records.RecordError, match="bar differ"):
        sweep(config, tmp_path / "c", [6], [], runner=runner, db_path=StoreConfig.db_path, kept=kept,
              bar=Bar(min_gain=0.3))
    with pytest.raises(records.RecordError, match="budget differ"):
        sweep(config, tmp_path / "c", [6], ["trainer.steps=3"], runner=runner, db_path=StoreConfig.db_path, kept=kept)
    assert len(ran) == 2


def test_a_record_whose_row_is_not_a_sweep_row_is_refused(tmp_path):
    config = Path("configs/local.yaml")
    setting = records.settings(config, [], bar=dataclasses.asdict(Bar()))
    records.write(tmp_path / "sweep-0-seed6.json", "learning_sweep", {"run": "sweep-0-seed6", "seed": 6}, setting,
                  {"row": {"run": "sweep-0-seed6"}})
    with pytest.raises(records.RecordError, match="its row is not a sweep row"):
        sweep(config, tmp_path / "w", [6], [], runner=None, kept=tmp_path)
