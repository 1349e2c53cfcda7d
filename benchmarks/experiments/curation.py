"""DART's curation where it can act (issue 42): a fixed, harder task set visited again and again
(configs/curation.yaml), plain GRPO against each curation piece alone and all of them.

    .venv/bin/python -m benchmarks.experiments.curation [--config configs/curation.yaml] [--seed 0 1 2]
                                                    [--steps N] [--max-seconds S] [--sft-run RUN_DIR ...]
                                                    [--batch-wait-s S] [--work DIR] [--records DIR]

Per seed one SFT base (demos, SFT, evaluation; or `--sft-run`), then one RL run per row from it,
everything but the pieces as the config says (curation_ablation.run_configs: the same runner,
resume and budget). Rows: plain GRPO (every piece off: fixed rollouts and step cap, no pool, no
selection, no TIS), plain GRPO + one piece (pool, dynamic rollouts, dynamic length, entropy
selection, TIS), and full (all on). A row whose runs finished under `--work` is not run again,
and a seed whose record is in `--records` (benchmarks/results/curation, kept in the repository:
records.py) is read back, not run: a seed is about 2 h on a 2-core machine, so seeds are
measured in separate sittings and pooled here.

Held-out success is reported for two groups apart: held-out seeds of the train tasks, and the
held-out tasks (names with no train seed). Each row's gain over plain GRPO is paired over the
same episodes within a seed, its 95% interval clustered by held-out task over every seed
(eval.stats.paired_gain).

The trace (`trace.jsonl` under `--work`, one line per run and train task, summarised per row in
a second table): rollouts the task got, the rollout count and step cap the scheduler gives it at
the run's end (dynamic rollouts, dynamic length), its rollouts cut at the cap, the pool's
injections into its groups, and from the trainer's per-task log (metrics/trainer_tasks.jsonl:
train.task_trace) the batches it was in, the fraction of its steps entropy selection kept and
its mean TIS weight by the advantage's sign (None where the trainer scored no old log-probs:
TIS alone, one update a batch). The second table gives each row's spread of those over its
tasks (min-max) beside the batch means of the trainer's log (kept fraction, TIS weight by
sign, the token-level net push). The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sqlite3
from pathlib import Path

from benchmarks.common import machine
from benchmarks.experiments import records
from benchmarks.experiments.curation_ablation import ORDER, Setup, add_arguments, off, row, run_configs, setup
from dart_jax.config import load
from dart_jax.data.scheduler import Scheduler
from dart_jax.data.store import Store
from dart_jax.eval.stats import Outcome, outcome_of
from dart_jax.run.schema import RunConfig

ROWS = (("plain GRPO", ()), ("+ pool", ("pool",)), ("+ dynamic rollouts", ("rollouts",)),
        ("+ dynamic length", ("length",)), ("+ entropy selection", ("selection",)), ("+ TIS", ("tis",)),
        ("full", ORDER))  # (label, pieces of curation_ablation.ORDER on)
TRAINER_TRACE = ("select/kept_frac", "tis/weight_pos", "tis/weight_neg", "push/net")
TASK_TRACE = ("kept_frac", "tis/weight_pos", "tis/weight_neg")  # per task, from metrics/trainer_tasks.jsonl
RECORDS = Path("benchmarks/results/curation")  # each finished seed's record, kept in the repository


def overrides(cfg: RunConfig, on: tuple[str, ...]) -> list[str]:
    """The overrides of a row: every piece not in `on` switched off."""
    return [o for piece in ORDER if piece not in on for o in off(cfg, piece)]


def held_out_groups(cfg: RunConfig) -> tuple[set[str], set[str]]:
    """(names with train seeds, names without): held-out seeds vs held-out tasks."""
    trained = {f"{s.backend}/{n}" for s in cfg.tasks.suites if s.train_seeds for n in s.names}
    every = {f"{s.backend}/{n}" for s in cfg.tasks.suites for n in s.names}
    return trained, every - trained


def split(outcomes: list, names: set[str]) -> list:
    """The `sampled` outcomes (task ids "seedS/backend/name/seed") of tasks named in `names`."""
    return [o for o in outcomes if o.task_id.split("/", 1)[1].rsplit("/", 1)[0] in names]


def rows_of(labels: list[str], outcomes: list[list], runs: list[list[dict]], sft: list) -> list[dict]:
    """Per row: held-out success, gain over SFT and over plain GRPO (row 0), paired, clustered."""
    out = [row("SFT only", sft, sft, None, None, [])]
    for i, label in enumerate(labels):
        r = row(label, outcomes[i], sft, outcomes[0] if i else None, None, runs[i])
        out.append({k: v for k, v in r.items() if not k.startswith("over_previous")})
    return out


def trace(run_dir: Path, cfg: RunConfig) -> list[dict]:
    """One run's per-task trace (the module docstring), read from its store and trainer log."""
    db = sqlite3.connect(f"file:{run_dir / cfg.data.store.db_path}?mode=ro", uri=True)
    try:
        per_task = db.execute(
            "SELECT t.task_id, COUNT(r.traj_id), COALESCE(SUM(r.success), 0), COALESCE(SUM(r.status = 'truncated'), 0) "
            "FROM tasks t LEFT JOIN trajectories r ON r.task_id = t.task_id AND r.source = 'rollout' "
            "WHERE t.split = 'train' GROUP BY t.task_id").fetchall()
        injected = dict(db.execute(
            "SELECT r.task_id, COUNT(*) FROM batch_items i JOIN trajectories r ON r.traj_id = i.traj_id "
            "WHERE i.injected = 1 GROUP BY r.task_id").fetchall())
    finally:
        db.close()
    store = Store.open(cfg.data.store, run_dir)
    try:
        scheduler = Scheduler(store, cfg.data.curation)
        budget = {t.task_id: scheduler.rollout_budget(t.task_id) for t in scheduler.tasks}
    finally:
        store.close()
    trainer = task_trainer_trace(run_dir)
    return [{"task": task, "rollouts": n, "successes": wins, "truncated": cut, "injected": injected.get(task, 0),
             "rollouts_given": budget[task][0], "step_cap": budget[task][1],
             **trainer.get(task, {"batches": 0} | dict.fromkeys(TASK_TRACE))}
            for task, n, wins, cut in per_task if task in budget]


def task_trainer_trace(run_dir: Path) -> dict[str, dict]:
    """Per task of the run's per-task trainer log: the batches it was in, kept_frac (steps
    kept / steps, over the batches with selection on) and tis/weight_{pos,neg} (means over
    the tokens of every batch); None where never logged. A step logged twice (a resumed
    trainer replays the batches after its checkpoint) counts once, as last logged."""
    path = run_dir / "metrics" / "trainer_tasks.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
    sums: dict[str, dict[str, float]] = {}
    for r in {(r["step"], r["task"]): r for r in lines}.values():
        s = sums.setdefault(r["task"], dict.fromkeys(("batches", "steps", "kept", "w_pos", "n_pos", "w_neg", "n_neg"), 0.0))
        s["batches"] += 1
        if r["kept"] is not None:
            s["steps"] += r["steps"]
            s["kept"] += r["kept"]
        for sign in ("pos", "neg"):
            if r[f"tis/weight_{sign}"] is not None:
                s[f"w_{sign}"] += r[f"tis/weight_{sign}"] * r[f"tis/tokens_{sign}"]
                s[f"n_{sign}"] += r[f"tis/tokens_{sign}"]
    ratio = lambda x, n: x / n if n else None  # noqa: E731
    return {task: {"batches": int(s["batches"]), "kept_frac": ratio(s["kept"], s["steps"]),
                   "tis/weight_pos": ratio(s["w_pos"], s["n_pos"]), "tis/weight_neg": ratio(s["w_neg"], s["n_neg"])}
            for task, s in sums.items()}


def trainer_trace(run_dir: Path) -> dict[str, float | None]:
    """Batch means of TRAINER_TRACE over the run's trainer log (None: never logged)."""
    path = run_dir / "metrics" / "trainer.jsonl"
    logged = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
    out = {}
    for key in TRAINER_TRACE:
        xs = [r[key] for r in logged if key in r]
        out[key] = sum(xs) / len(xs) if xs else None
    return out


def summarise(label: str, tasks: list[dict], trainer: list[dict]) -> dict:
    """A row's trace over its runs: rollouts, final budgets and caps, cut-offs, injections
    (means over task-runs), the spread of the per-task kept fraction and TIS weights over
    task-runs ("per_task/" + key: [min, max], None where no task has one), and the trainer's
    batch means (over runs that logged them)."""
    n = max(len(tasks), 1)
    mean = lambda key: sum(t[key] for t in tasks) / n  # noqa: E731
    out = {"config": label, **{k: mean(k) for k in ("rollouts", "rollouts_given", "step_cap", "truncated", "injected")}}
    for key in TASK_TRACE:
        xs = [t[key] for t in tasks if t.get(key) is not None]
        out[f"per_task/{key}"] = [min(xs), max(xs)] if xs else None
    for key in TRAINER_TRACE:
        xs = [t[key] for t in trainer if t[key] is not None]
        out[key] = sum(xs) / len(xs) if xs else None
    return out


def table(rows: list[dict], title: str) -> str:
    head = f"{title:<20} {'held-out':>8} {'n':>5} {'gain over SFT':>24} {'over plain GRPO':>24}  runs (steps)"
    lines = [head, "-" * len(head)]
    for r in rows:
        gains = " ".join(f"{_gain(r[k], r[f'{k}_ci95']):>24}" for k in ("gain", "over_plain"))
        runs = ", ".join(str(x["rl_steps"]) + (" collapsed" if x["collapsed"] else "") for x in r["runs"]) or "-"
        lines.append(f"{r['config']:<20} {r['success']:>8.3f} {r['n']:>5} {gains}  {runs}")
    return "\n".join(lines)


def trace_table(summaries: list[dict]) -> str:
    """Per row: the store's means per task-run, the per-task spreads (min-max over task-runs)
    and the trainer's batch means."""
    head = (f"{'configuration':<20} {'rollouts/task':>13} {'given':>6} {'cap':>5} {'cut':>5} {'injected':>8} "
            f"{'kept/task':>9} {'TIS+/task':>9} {'TIS-/task':>9} {'kept':>5} {'TIS +':>6} {'TIS -':>6} {'push':>6}")
    lines = [head, "-" * len(head)]
    for s in summaries:
        spread = " ".join(f"{'-' if s[f'per_task/{k}'] is None else '{:.2f}-{:.2f}'.format(*s[f'per_task/{k}']):>9}"
                          for k in TASK_TRACE)
        tr = " ".join(f"{'-' if s[k] is None else f'{s[k]:.2f}':>{w}}" for k, w in zip(TRAINER_TRACE, (5, 6, 6, 6)))
        lines.append(f"{s['config']:<20} {s['rollouts']:>13.1f} {s['rollouts_given']:>6.1f} {s['step_cap']:>5.1f} "
                     f"{s['truncated']:>5.1f} {s['injected']:>8.1f} {spread} {tr}")
    return "\n".join(lines)


def _gain(g, ci) -> str:
    return "-" if g is None else f"{g:+.3f} [{ci[0]:+.2f}, {ci[1]:+.2f}]"


def measure_seed(args: argparse.Namespace, s: Setup, k: int, rows: list[tuple[str, list[str]]]) -> dict:
    """Seed `args.seed[k]`'s runs (curation_ablation.run_configs: resumed from `--work`) as its
    record's body: the SFT base's sampled episodes and per row its run facts, episodes,
    per-task trace and the trainer's batch means."""
    seed = args.seed[k]
    done = run_configs(args.config, s.root, [seed], args.sft_run[k:k + 1], rows, "curation",
                       s.overrides(args.batch_wait_s))
    out = []
    for i, (label, _) in enumerate(rows):
        (d,) = done.dirs[i]
        out.append({"label": label, "run": {"name": d.name, **done.runs[i][0]},
                    "outcomes": [episode_json(o) for o in done.outcomes[i]],
                    "tasks": trace(d, load(RunConfig, d / "config.yaml")), "trainer": trainer_trace(d)})
    return {"sft": [episode_json(o) for o in done.sft], "rows": out}


def episode_json(o: Outcome) -> dict:
    """An episode as a record keeps it: without the policy's text (the tables never read it)."""
    return dataclasses.asdict(dataclasses.replace(o, actions=()))




def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_arguments(ap, "configs/curation.yaml", [0, 1, 2])
    ap.add_argument("--records", type=Path, default=RECORDS, help="where each finished seed's record is kept "
                    "and read back (benchmarks/experiments/records.py): a seed recorded there is not run again")
    args = ap.parse_args()
    s = setup(ap, args, "bench_curation_")
    labels = [label for label, _ in ROWS]
    rows = [(label, overrides(s.cfg, on)) for label, on in ROWS]
    setting = records.settings(args.config, s.overrides(args.batch_wait_s), rows=[[lb, o] for lb, o in rows])
    seeds = []
    for k, seed in enumerate(args.seed):
        path, ident = args.records / f"seed{seed}.json", {"seed": seed}
        try:
            body = (records.read(path, "curation", ident, setting)
                    or records.write(path, "curation", ident, setting, measure_seed(args, s, k, rows)))
        except records.RecordError as e:
            ap.error(str(e))
        try:  # what a record holds, as the tables read it
            seeds.append(body | {"sft": [outcome_of(e) for e in body["sft"]],
                                 "rows": [r | {"outcomes": [outcome_of(e) for e in r["outcomes"]]} for r in body["rows"]]})
            ok = [r["label"] for r in body["rows"]] == labels
        except (KeyError, TypeError, AttributeError) as e:
            ap.error(f"{path}: not a curation seed record ({type(e).__name__}: {e})")
        if not ok:
            ap.error(f"{path}: its rows are not {labels}")
    sft = [o for r in seeds for o in r["sft"]]
    outcomes = [[o for r in seeds for o in r["rows"][i]["outcomes"]] for i in range(len(rows))]
    runs = [[{k: v for k, v in r["rows"][i]["run"].items() if k != "name"} for r in seeds] for i in range(len(rows))]
    trained, held_tasks = held_out_groups(s.cfg)
    groups = {group: rows_of(labels, [split(o, names) for o in outcomes], runs, split(sft, names))
              for group, names in (("held_out_seeds", trained), ("held_out_tasks", held_tasks)) if names}
    summaries = []
    s.root.mkdir(parents=True, exist_ok=True)
    with (s.root / "trace.jsonl").open("w") as f:
        for i, label in enumerate(labels):
            tasks = [t | {"config": label, "run": r["rows"][i]["run"]["name"]} for r in seeds for t in r["rows"][i]["tasks"]]
            f.writelines(json.dumps(t) + "\n" for t in tasks)
            summaries.append(summarise(label, tasks, [r["rows"][i]["trainer"] for r in seeds]))
    for group, table_rows in groups.items():
        print(table(table_rows, group.replace("_", " ")))
    print(trace_table(summaries))
    print(json.dumps({"benchmark": "curation", "config": str(args.config), "rl_steps": s.steps,
                      "rl_max_seconds": s.budget, "seeds": args.seed, **groups, "trace": summaries,
                      "records": {seed: {"commit": r["commit"], "written": r["written"]} for seed, r in zip(args.seed, seeds)},
                      "trace_file": str(s.root / "trace.jsonl"), "work": str(s.root), "machine": machine()}))


if __name__ == "__main__":
    main()
