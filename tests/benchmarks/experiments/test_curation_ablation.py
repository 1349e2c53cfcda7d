"""The curation ablation's configurations: each adds one DART piece to plain GRPO, and every
override it writes is a real setting of the run config (the benchmark itself is a command)."""

import dataclasses
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from benchmarks.experiments.curation_ablation import PIECES, finished, row, sampled, sft_summary, table, variant
from dart_jax.config.loader import apply_overrides, from_dict
from dart_jax.run.schema import RunConfig
from tests.procs import descendants


def _resolved(base: RunConfig, overrides: list[str]) -> RunConfig:
    return from_dict(RunConfig, apply_overrides(dataclasses.asdict(base), overrides, "test"))


def test_each_configuration_switches_on_one_more_piece():
    base = _resolved(RunConfig(), ["data.curation.max_rollouts=8", "data.curation.default_max_steps=4",
                                   "data.curation.min_steps=3", "data.curation.max_steps=5"])
    got = []
    for _, on in PIECES:
        cfg = _resolved(base, variant(base, on))
        c = cfg.data.curation
        got.append((c.min_rollouts == c.max_rollouts, c.min_steps == c.max_steps == c.default_max_steps,
                    cfg.trainer.selection.enabled, cfg.trainer.tis.enabled, c.experience_pool))
    fixed, plain = (True, True, False, False, False), (False, False, True, True, True)
    assert [label for label, _ in PIECES][0] == "plain GRPO" and got[0] == fixed
    for i in range(1, len(got)):  # piece i switched on, the earlier ones stay on
        assert got[i] == plain[:i] + fixed[i:], (PIECES[i][0], got[i])
    assert got[-1] == plain  # full: every piece on


def test_sft_run_is_read_from_a_finished_run_and_refused_when_it_lacks_the_sft_phases(tmp_path):
    (tmp_path / "metrics").mkdir()
    (tmp_path / "data" / "demos").mkdir(parents=True)
    (tmp_path / "eval").mkdir()
    (tmp_path / "metrics" / "run.jsonl").write_text('{"step": 0, "heldout_succ')  # a run killed mid-write
    with pytest.raises(SystemExit, match="does not end in a JSON summary"):
        sft_summary(tmp_path)
    (tmp_path / "metrics" / "run.jsonl").write_text(json.dumps({"step": 0, "heldout_success_sft": 0.2}) + "\n")
    with pytest.raises(SystemExit, match="sft_export"):
        sft_summary(tmp_path)
    summary = {"step": 0, "heldout_success_sft": 0.2, "sft_export": str(tmp_path / "sft" / "export" / "step-4")}
    with (tmp_path / "metrics" / "run.jsonl").open("a") as f:
        f.write(json.dumps(summary) + "\n")
    with pytest.raises(SystemExit, match="eval/sft.json"):
        sft_summary(tmp_path)
    (tmp_path / "eval" / "sft.json").write_text("{}")
    assert sft_summary(tmp_path) == summary


def test_a_resumed_ablation_takes_only_the_runs_that_finished_their_evaluation(tmp_path):
    (tmp_path / "metrics").mkdir()
    (tmp_path / "eval").mkdir()
    assert finished(tmp_path) is None  # nothing yet
    (tmp_path / "metrics" / "run.jsonl").write_text(json.dumps({"step": 0, "rl_steps": 45}) + "\n")
    assert finished(tmp_path) is None  # killed after RL, before its evaluation
    summary = {"step": 0, "rl_steps": 45, "heldout_success_rl": 0.8}
    (tmp_path / "metrics" / "run.jsonl").write_text(json.dumps(summary) + "\n" + '{"step": 0, "rl')
    assert finished(tmp_path) is None  # a summary cut mid-write
    (tmp_path / "metrics" / "run.jsonl").write_text(json.dumps(summary) + "\n")
    assert finished(tmp_path) is None  # its episodes are missing
    (tmp_path / "eval" / "rl.json").write_text("{}")
    assert finished(tmp_path) == summary


def test_the_table_says_how_each_seeds_run_ended_and_where_it_collapsed():
    row = {"success": 0.5, "ci95": [0.4, 0.6], "gain": 0.1, "gain_ci95": [0.02, 0.18], "over_plain": -0.05,
           "over_plain_ci95": [-0.1, 0.0], "over_previous": None, "over_previous_ci95": None}
    run = {"seed": 3, "rl_steps": 30, "stalled": False, "out_of_time": False, "collapsed": False,
           "collapsed_version": None}
    lines = table([{"config": "plain GRPO", "runs": [run, {**run, "seed": 4, "rl_steps": 28}], **row},
                   {"config": "+ dynamic rollouts", "runs": [{**run, "rl_steps": 5, "stalled": True}], **row},
                   {"config": "+ TIS", "runs": [{**run, "rl_steps": 34, "out_of_time": True, "collapsed": True,
                                                  "collapsed_version": 17}], **row}]).splitlines()
    assert "RL steps" in lines[0] and "over plain GRPO" in lines[0]
    assert "30, 28" in lines[2] and "stalled" not in lines[2] and "time" not in lines[2]
    assert "5 (stalled)" in lines[3]
    assert "34 (time, collapsed v17)" in lines[4]
    assert "+0.100 [0.02, 0.18]" in lines[2] and "-0.050 [-0.10, +0.00]" in lines[2] and lines[2].endswith(" -")


def test_rows_pair_episodes_within_each_seed_and_cluster_by_task():
    """Seed 3 and seed 4 play the same task ids with different seeds: a row pools both seeds'
    episodes, and its gains pair each episode with the same seed's; the interval clusters a
    task's episodes over both seeds. Gain over SFT: t0 +2 of 4 (seed 3's first two), t1 +1 of
    4 (seed 4's third): 3 / 8; clusters t0 (sum 2, n 4), t1 (sum 1, n 4):
    se² = 2 · ((2 - 1.5)² + (1 - 1.5)²) / 64 = 1 / 64, half = t_1 · 1/8 (t_1 = 12.7062)."""
    from dart_jax.eval.stats import Outcome

    def outcomes(seed, wins_t0, wins_t1):
        return sampled([Outcome(t, "sampled", i, bool(w), float(w), 1, "success" if w else "failure")
                        for t, wins in (("t0", wins_t0), ("t1", wins_t1)) for i, w in enumerate(wins)]
                       + [Outcome("t0", "greedy", 0, True, 1.0, 1, "success")], seed)
    sft = outcomes(3, [0, 0], [1, 1]) + outcomes(4, [1, 1], [1, 0])
    plain = outcomes(3, [1, 0], [1, 1]) + outcomes(4, [1, 1], [0, 1])
    full = outcomes(3, [1, 1], [1, 1]) + outcomes(4, [1, 1], [1, 1])
    r = row("full", full, sft, plain, plain, [])
    assert (r["success"], r["n"]) == (1.0, 8)  # greedy episodes left out
    assert r["gain"] == pytest.approx(3 / 8)
    assert r["gain_ci95"] == pytest.approx([3 / 8 - 12.706204736 / 8, 3 / 8 + 12.706204736 / 8])
    assert r["over_plain"] == pytest.approx(2 / 8) and r["over_previous"] == pytest.approx(2 / 8)
    assert row("plain GRPO", plain, sft, None, None, [])["over_plain"] is None


@pytest.mark.slow
def test_a_killed_ablation_takes_its_runs_roles_with_it(tmp_path):
    """SIGTERM to the benchmark (a stalled configuration is killed by hand) unwinds its run:
    the data manager and env server it started are stopped, not left orphaned."""
    root = Path(__file__).resolve().parents[3]
    argv = [sys.executable, "-m", "benchmarks.experiments.curation_ablation", "--config", "configs/rl.yaml", "--work", str(tmp_path)]
    proc = subprocess.Popen(argv, cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    roles: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 120
        while len(roles := _roles(proc.pid)) < 2:  # the demos phase: data manager and env server up
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "no data manager and env server in 120 s"
            time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(120)
        gone, alive = psutil.wait_procs(roles, timeout=60)
        assert (code, [p.pid for p in alive]) == (128 + signal.SIGTERM, [])
    finally:  # leave nothing behind for the next test, whatever failed
        for p in [*roles, psutil.Process(proc.pid)] if proc.poll() is None else roles:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass


def _roles(pid: int) -> list[psutil.Process]:
    """The role processes (`dart_jax.cli data-manager|env-server ...`) under process `pid`."""
    out = []
    for p in descendants(pid):
        try:
            if any(role in p.cmdline() for role in ("data-manager", "env-server")):
                out.append(p)
        except psutil.NoSuchProcess:
            continue
    return out
