"""The curation benchmark's logic at a tiny size, no learning run: its rows' settings, the
shared runner's resume with a stand-in for `dart-jax run`, held-out groups, the tables and the
JSON from hand-made outcomes, and the per-task trace from a hand-made store and per-task trainer log."""

import dataclasses
import json
from pathlib import Path

import pytest

from benchmarks.experiments import curation, curation_ablation
from benchmarks.experiments.curation import (ROWS, held_out_groups, overrides, rows_of, split, summarise, table,
                                             trace, trace_table)
from dart_jax.config import dump, load
from dart_jax.config.loader import apply_overrides, from_dict
from dart_jax.data.store import Store
from dart_jax.eval.stats import Outcome, report
from dart_jax.run.schema import RunConfig
from dart_jax.rundir import MetricsWriter, RunDir
from dart_jax.train.main import task_writer
from dart_jax.train.task_trace import TaskTrace
from dart_jax.testing.trajectories import make_trajectory, put
from dart_jax.data.curation import Group, TrajRecord
from dart_jax.wire.messages import TaskSpec

CFG = load(RunConfig, Path("configs/curation.yaml"), [])


def _settings(on) -> tuple:
    cfg = from_dict(RunConfig, apply_overrides(dataclasses.asdict(CFG), overrides(CFG, on), "test"))
    c = cfg.data.curation
    return (c.experience_pool, c.min_rollouts < c.max_rollouts, c.min_steps < c.max_steps,
            cfg.trainer.selection.enabled, cfg.trainer.tis.enabled)


def test_each_row_switches_on_exactly_its_pieces():
    got = {label: _settings(on) for label, on in ROWS}
    assert got == {"plain GRPO": (False,) * 5, "+ pool": (True, False, False, False, False),
                   "+ dynamic rollouts": (False, True, False, False, False),
                   "+ dynamic length": (False, False, True, False, False),
                   "+ entropy selection": (False, False, False, True, False),
                   "+ TIS": (False, False, False, False, True), "full": (True,) * 5}


def test_the_task_set_is_fixed_and_has_a_held_out_group():
    trained, held = held_out_groups(CFG)
    assert held == {"synthetic/click-color", "miniwob/click-button", "miniwob/click-test-2"}
    assert "synthetic/form" in trained and not trained & held
    assert CFG.data.curation.rl_seeds == 4 and CFG.eval.max_steps >= 10


def _outcome(task, i, win):
    return Outcome(task, "sampled", i, bool(win), float(win), 1, "success" if win else "failure")


WINS = {"synthetic/a": ([0, 0], [1, 1]), "synthetic/b": ([1, 0], [1, 0]), "synthetic/c": ([0, 0], [1, 0])}


def _fake_runs(calls: list[str], wins_of=WINS):
    """A stand-in for curation_ablation.one_run: a finished run directory, its episodes on seed
    10000 of each task of `wins_of` (task: (SFT's wins, every RL row's wins)); by default SFT:
    t/a wins 0 of 2, t/b 1 of 2, h/c 0 of 2; every RL row: 2, 1 and 1."""
    def one_run(config, root, name, extra):
        calls.append(name)
        run = RunDir.create(root / name, config_yaml=dump(CFG))
        rl = not name.startswith("sft")
        wins = {f"{task}/10000": ws[rl] for task, ws in wins_of.items()}
        eps = [_outcome(t, i, w) for t, ws in wins.items() for i, w in enumerate(ws)]
        (run.root / "eval").mkdir(exist_ok=True)
        (run.root / "eval" / ("rl.json" if rl else "sft.json")).write_text(json.dumps(report("x", root, eps)))
        (run.root / "data" / "demos").mkdir(parents=True, exist_ok=True)
        summary = ({"rl_steps": 3, "heldout_success_rl": 0.5, "rl_stalled": False, "rl_out_of_time": False,
                    "rl_collapsed": False, "rl_collapsed_version": None} if rl else
                   {"sft_export": str(run.root / "sft"), "heldout_success_sft": 0.2})
        (run.root / "metrics" / "run.jsonl").write_text(json.dumps(summary) + "\n")
        return summary
    return one_run


def test_runs_resume_and_rows_pair_within_seeds_and_group_the_held_out_tasks(tmp_path, monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(curation_ablation, "one_run", _fake_runs(calls))
    configs = [(label, overrides(CFG, on)) for label, on in ROWS[:2]]
    done = curation_ablation.run_configs(Path("x.yaml"), tmp_path, [0], [], configs, "curation", [])
    assert calls == ["sft-seed0", "curation-0-seed0", "curation-1-seed0"]
    calls.clear()
    done = curation_ablation.run_configs(Path("x.yaml"), tmp_path, [0, 1], [], configs, "curation", [])
    assert calls == ["sft-seed1", "curation-0-seed1", "curation-1-seed1"]  # seed 0's were kept
    assert [d.name for d in done.dirs[1]] == ["curation-1-seed0", "curation-1-seed1"]
    # held-out seeds of tasks a, b; held-out task c
    seeds = ["plain GRPO", "+ pool"]
    rows = rows_of(seeds, [split(o, {"synthetic/a", "synthetic/b"}) for o in done.outcomes], done.runs,
                   split(done.sft, {"synthetic/a", "synthetic/b"}))
    assert [r["config"] for r in rows] == ["SFT only", "plain GRPO", "+ pool"]
    # gain over SFT: a +2 of 2 in each seed, b 0: 4 of 8; clusters a (sum 4, n 4) and b (0, 4):
    # se² = 2 · ((4 - 2)² + (0 - 2)²) / 64 = 1/4, t_1 = 12.7062: half 6.353
    assert rows[1]["gain"] == pytest.approx(0.5) and rows[1]["gain_ci95"] == pytest.approx([0.5 - 6.3531024, 0.5 + 6.3531024])
    assert rows[2]["over_plain"] == 0.0 and rows[1]["over_plain"] is None and "over_previous" not in rows[2]
    held = split(done.outcomes[0], {"synthetic/c"})
    assert len(held) == 4 and sum(o.success for o in held) == 2
    text = table(rows, "held out seeds").splitlines()
    assert text[0].startswith("held out seeds") and text[3].startswith("plain GRPO")
    assert "+0.500 [-5.85, +6.85]" in text[3] and text[3].endswith("3, 3")
    json.dumps(rows)


def test_the_trace_reads_each_tasks_rollouts_budget_cap_and_injections(tmp_path):
    cfg = CFG
    run = RunDir.create(tmp_path / "run", config_yaml=dump(cfg))
    store = Store.open(cfg.data.store, run.root)
    store.upsert_tasks([TaskSpec(task_id=f"synthetic/form/{s}", backend="synthetic", name="form", seed=s)
                        for s in range(6)])
    # form/0: 16 rollouts, all 2-step successes -> 2 rollouts, cap 2 + 2 = 4; form/1: 3 failures (1 cut
    # at the cap) -> 8 rollouts, and the pool's 5-step success -> cap 5 + 2 = 7
    put(store, *[make_trajectory(f"a{i}", "synthetic/form/0", success=True, steps=2) for i in range(16)],
        *[make_trajectory(f"b{i}", "synthetic/form/1", steps=8) for i in range(3)],
        make_trajectory("p0", "synthetic/form/1", success=True, steps=5, source="pool"))
    store.query("UPDATE trajectories SET status = 'truncated' WHERE traj_id = 'b0'")
    store.record_batch(1, 0, [Group("synthetic/form/1", (TrajRecord("p0", "synthetic/form/1", 0, True, 5, 0, 0),
                                                         TrajRecord("b1", "synthetic/form/1", 0, False, 8, 0, 0)),
                                    injected=("p0",))])
    store.close()
    # the trainer's per-task log, as train.main writes it: form/1 in two batches (kept 3 of 4
    # steps each; TIS + 1.2 on 10 tokens then 1.0 on 30, TIS - 0.8 on 30 then none; step 1
    # logged twice), form/0 in one
    tasks = MetricsWriter(run.metrics_path("trainer_tasks"))
    write = task_writer(tasks)
    write(1, (TaskTrace("synthetic/form/1", 4, 1, 0.5, 10, 0.5, 30),))  # replayed after a resume: the next line counts
    write(1, (TaskTrace("synthetic/form/1", 4, 3, 1.2, 10, 0.8, 30),))
    write(2, (TaskTrace("synthetic/form/1", 4, 3, 1.0, 30, None, 0), TaskTrace("synthetic/form/0", 2, 2, None, 0, None, 0)))
    tasks.close()
    got = {t["task"]: t for t in trace(run.root, cfg)}
    assert set(got) == {f"synthetic/form/{s}" for s in range(4)}  # rl_seeds 4: seeds 4, 5 are demos only
    assert got["synthetic/form/0"] == {"task": "synthetic/form/0", "rollouts": 16, "successes": 16, "truncated": 0,
                                           "injected": 0, "rollouts_given": 2, "step_cap": 4, "batches": 1,
                                           "kept_frac": 1.0, "tis/weight_pos": None, "tis/weight_neg": None}
    f1 = got["synthetic/form/1"]
    assert (f1["rollouts"], f1["truncated"], f1["injected"], f1["rollouts_given"], f1["step_cap"]) == (3, 1, 1, 8, 7)
    assert (f1["batches"], f1["kept_frac"], f1["tis/weight_neg"]) == (2, 0.75, 0.8)
    assert f1["tis/weight_pos"] == pytest.approx((1.2 * 10 + 1.0 * 30) / 40)
    assert got["synthetic/form/2"]["batches"] == 0 and got["synthetic/form/2"]["kept_frac"] is None
    (run.root / "metrics" / "trainer.jsonl").write_text(
        "\n".join(json.dumps(r) for r in ({"select/kept_frac": 0.75, "tis/weight_pos": 1.0},
                                          {"select/kept_frac": 0.85, "tis/weight_pos": 1.2, "push/net": 0.0})))
    s = summarise("full", list(got.values()), [curation.trainer_trace(run.root)])
    assert s["rollouts"] == pytest.approx(19 / 4) and s["injected"] == pytest.approx(0.25)
    assert s["select/kept_frac"] == pytest.approx(0.8) and s["tis/weight_pos"] == pytest.approx(1.1)
    assert s["tis/weight_neg"] is None and s["push/net"] == 0.0
    assert s["per_task/kept_frac"] == [0.75, 1.0] and s["per_task/tis/weight_neg"] == [0.8, 0.8]
    assert s["per_task/tis/weight_pos"] == pytest.approx([1.05, 1.05])
    line = trace_table([s]).splitlines()[2]
    assert line.startswith("full") and "0.75-1.00 1.05-1.05 0.80-0.80" in line


def _bench(monkeypatch, capsys, *argv) -> dict:
    monkeypatch.setattr("sys.argv", ["curation", *argv])
    curation.main()
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_a_recorded_seed_is_read_back_not_run_and_pools_with_new_ones(tmp_path, monkeypatch, capsys):
    calls: list[str] = []
    # held-out seeds of click-button and form, held-out tasks click-color and MiniWoB click-button
    monkeypatch.setattr(curation_ablation, "one_run", _fake_runs(calls, {
        "synthetic/click-button": ([0, 0], [1, 1]), "synthetic/form": ([1, 0], [1, 0]),
        "synthetic/click-color": ([0, 0], [1, 0]), "miniwob/click-button": ([0, 1], [1, 1])}))
    monkeypatch.setattr(curation, "trace", lambda d, cfg: [{"task": "synthetic/form/0", "rollouts": 8, "successes": 1,
                                                            "truncated": 0, "injected": 1 if "-1-" in d.name else 0,
                                                            "rollouts_given": 8, "step_cap": 8, "batches": 1,
                                                            **dict.fromkeys(curation.TASK_TRACE)}])
    records = tmp_path / "records"
    first = _bench(monkeypatch, capsys, "--seed", "0", "--work", str(tmp_path / "a"), "--records", str(records))
    assert calls == ["sft-seed0", *[f"curation-{i}-seed0" for i in range(len(ROWS))]]
    assert (records / "seed0.json").is_file() and first["records"]["0"]["commit"]
    calls.clear()
    # a fresh machine: the runs of seed 0 are gone, its record is not
    both = _bench(monkeypatch, capsys, "--seed", "0", "1", "--work", str(tmp_path / "b"), "--records", str(records))
    assert calls == ["sft-seed1", *[f"curation-{i}-seed1" for i in range(len(ROWS))]]
    seeds, tasks = both["held_out_seeds"], both["held_out_tasks"]
    assert [r["n"] for r in seeds] == [8] * (len(ROWS) + 1) and [r["n"] for r in tasks] == [8] * (len(ROWS) + 1)
    assert seeds[1]["success"] == 0.75 and seeds[0]["success"] == 0.25 and tasks[1]["success"] == 0.75
    assert [r["seed"] for r in seeds[1]["runs"]] == [0, 1]
    assert both["trace"][1]["config"] == "+ pool" and both["trace"][1]["injected"] == 1.0
    trace_lines = (tmp_path / "b" / "trace.jsonl").read_text().splitlines()
    assert {json.loads(t)["run"] for t in trace_lines} == {f"curation-{i}-seed{s}" for i in range(len(ROWS)) for s in (0, 1)}
    calls.clear()
    # another RL budget is another experiment: refused, nothing run
    with pytest.raises(SystemExit) as e:
        _bench(monkeypatch, capsys, "--seed", "0", "--batch-wait-s", "5", "--work", str(tmp_path / "c"),
               "--records", str(records))
    assert e.value.code == 2 and calls == [] and "budget differ" in capsys.readouterr().err
    (records / "seed1.json").write_text("{")
    with pytest.raises(SystemExit):
        _bench(monkeypatch, capsys, "--seed", "1", "--work", str(tmp_path / "c"), "--records", str(records))
    assert calls == [] and "not a readable record" in capsys.readouterr().err


def test_a_record_whose_body_is_not_a_seeds_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    from benchmarks.experiments import records
    cfg_rows = [(label, overrides(CFG, on)) for label, on in ROWS]
    budget = curation_ablation.Setup(tmp_path, CFG, CFG.trainer.steps, CFG.trainer.max_seconds).overrides(300.0)
    setting = records.settings(Path("configs/curation.yaml"), budget, rows=[[lb, o] for lb, o in cfg_rows])
    records.write(tmp_path / "r" / "seed0.json", "curation", {"seed": 0}, setting, {"sft": [{"task_id": 1}], "rows": []})
    monkeypatch.setattr(curation_ablation, "one_run", _fake_runs([]))
    with pytest.raises(SystemExit) as e:
        _bench(monkeypatch, capsys, "--seed", "0", "--work", str(tmp_path / "w"), "--records", str(tmp_path / "r"))
    assert e.value.code == 2 and "not a curation seed record (TypeError" in capsys.readouterr().err
