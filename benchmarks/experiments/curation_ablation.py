"""DART's curation ablation on the local learning proof: one SFT policy, then each curation
piece added in turn, with the same seeds and the same RL budget per configuration.

    .venv/bin/python -m benchmarks.experiments.curation_ablation [--config configs/local.yaml] [--steps N]
                                                     [--seed S [S ...]] [--max-seconds S]
                                                     [--sft-run RUN_DIR ...] [--batch-wait-s S] [--work DIR]

Per seed, a `dart-jax run` of the config's demos, sft and eval phases gives the SFT policy
and its held-out success (or `--sft-run`, once per seed: those phases of a finished run of
the same config and seed, such as a `make run` or a learning-sweep run, whose RL phase then
is the `full` configuration's twin). Each configuration is then a run of phases [rl, eval]
from that policy with the same tasks, demonstrations, seeds, RL budget (the config's
`trainer.steps` and `trainer.max_seconds`, whichever ends first, as in `make run`) and
evaluation episodes. Everything except the pieces below stays as the config says (the
loss, its clip and KL term, the optimizer):

    plain GRPO           fixed max_rollouts per task, fixed step cap (default_max_steps), no
                         experience pool, every step trained, no truncated importance sampling
    + dynamic rollouts   rollouts per task from its recent success rate
    + dynamic length     step cap per task from its successful lengths
    + entropy selection  only the top fraction of steps by token entropy trained
    + TIS                truncated importance sampling against the engine's log-probs
    full                 + the experience pool (a group without a success takes a stored one)

Runs go under `--work` (default: a new temporary directory). A configuration whose run
there has finished (its summary holds the RL evaluation) is taken as it is, not run again:
an interrupted ablation resumes where it stopped, and one run again with another seed added
(`--seed 0 1` after `--seed 0`, same `--work`) runs only the new seed and pools both.

A configuration whose trainer gets no batch for `--batch-wait-s` seconds (its rollouts give
nothing to learn from: every group failed and no pool fills in) stops at the step it
reached and is evaluated there; its row says so, as it says which configurations the clock
stopped.

Printed as DART's ablation table and as JSON on the last line: per configuration the RL
steps of each seed's run (and whether the clock or a stall ended it, and whether training
collapsed by the run's rule, `rl_collapsed`, at which policy version), held-out success with
its Wilson 95% interval over every seed's episodes, and its gains over SFT, over plain GRPO
and over the row before (the piece just added), each paired over the same eval episodes
(pairs form within a seed) with a 95% interval clustered by held-out task (a task's samples,
in every seed, count as one cluster: eval.stats.paired_gain).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
from pathlib import Path

from benchmarks.common import machine, socket_overrides
from dart_jax.config import load
from dart_jax.run.schema import RunConfig
from dart_jax.eval.stats import load_outcomes, paired_gain, wilson
from dart_jax.run.main import run, stop_on_sigterm

ORDER = ("rollouts", "length", "selection", "tis", "pool")  # DART's ablation order
PIECES = (("plain GRPO", 0), ("+ dynamic rollouts", 1), ("+ dynamic length", 2),
          ("+ entropy selection", 3), ("+ TIS", 4), ("full", 5))  # (label, pieces of ORDER on)


def off(cfg, piece: str) -> list[str]:
    """The overrides that switch one curation piece off."""
    c = cfg.data.curation
    return {"rollouts": [f"data.curation.min_rollouts={c.max_rollouts}"],
            "length": [f"data.curation.min_steps={c.default_max_steps}",
                       f"data.curation.max_steps={c.default_max_steps}"],
            "selection": ["trainer.selection.enabled=false"],
            "tis": ["trainer.tis.enabled=false"],
            "pool": ["data.curation.experience_pool=false"]}[piece]


def variant(cfg, on: int) -> list[str]:
    """Overrides of one configuration: the first `on` pieces of ORDER on, the rest off."""
    return [o for piece in ORDER[on:] for o in off(cfg, piece)]


def one_run(config: Path, root: Path, name: str, extra: list[str]) -> dict:
    summary = run(load(RunConfig, config, [f"run.root={root}", f"run.name={name}", "run.view=lines",
                                           *socket_overrides(root, name), *extra]))
    print(json.dumps({"run": name, **{k: v for k, v in summary.items() if k != "plots"}}), flush=True)
    return summary


def sft_summary(run_dir: Path) -> dict:
    """The summary a finished `dart-jax run` wrote last (metrics/run.jsonl), which must hold its
    SFT export and SFT evaluation; SystemExit naming what is missing otherwise."""
    path = run_dir / "metrics" / "run.jsonl"
    lines = path.read_text().splitlines() if path.is_file() else []
    try:
        summary = json.loads(lines[-1]) if lines else {}
    except json.JSONDecodeError as e:
        raise SystemExit(f"--sft-run {run_dir}: {path} does not end in a JSON summary ({e})") from None
    missing = [k for k in ("sft_export", "heldout_success_sft") if k not in summary]
    if missing or not (run_dir / "eval" / "sft.json").is_file() or not (run_dir / "data" / "demos").is_dir():
        raise SystemExit(f"--sft-run {run_dir}: not a finished run with demos, sft and eval phases "
                         f"(missing: {', '.join(missing) or 'eval/sft.json or data/demos'})")
    return summary


def finished(run_dir: Path) -> dict | None:
    """The summary of a configuration's run that finished its RL phase and its evaluation
    (a resumed ablation takes it instead of running it again); None otherwise."""
    path = run_dir / "metrics" / "run.jsonl"
    lines = path.read_text().splitlines() if path.is_file() else []
    try:
        summary = json.loads(lines[-1]) if lines else {}
    except json.JSONDecodeError:
        return None  # killed mid-write: run it again
    done = all(k in summary for k in ("rl_steps", "heldout_success_rl")) and (run_dir / "eval" / "rl.json").is_file()
    return summary if done else None


def sampled(outcomes, seed: int) -> list:
    """The sampled episodes of one seed's evaluation, named by seed as well: episodes of
    different seeds are different episodes, and pairs form only within a seed."""
    return [dataclasses.replace(o, task_id=f"seed{seed}/{o.task_id}") for o in outcomes if o.mode == "sampled"]


def task_of(o) -> str:
    """The held-out task of a `sampled` outcome, whatever the seed: a task's episodes share its
    difficulty in every seed's runs, so they form one cluster of the gain's interval."""
    return o.task_id.split("/", 1)[1]


def row(label: str, outcomes: list, sft: list, plain: list | None, previous: list | None, runs: list[dict]) -> dict:
    """One configuration over its seeds: held-out success (Wilson), its gain over SFT, over plain
    GRPO and over the row before (the piece's own share), each paired over the same episodes,
    and per seed its RL steps, how the run ended and whether training collapsed (and where)."""
    wins, n = sum(o.success for o in outcomes), len(outcomes)
    out = {"config": label, "success": wins / n, "n": n, "ci95": list(wilson(wins, n))}
    for key, base in (("gain", sft), ("over_plain", plain), ("over_previous", previous)):
        g = paired_gain(base, outcomes, cluster=task_of) if base is not None else None
        out[key], out[f"{key}_ci95"] = (g["gain"], g["ci95"]) if g else (None, None)
    return out | {"runs": runs}


@dataclasses.dataclass(frozen=True)
class Done:
    """Every configuration's runs over the seeds: sampled outcomes pooled (task ids named by
    seed: `sampled`), per-seed run facts, and each run's directory."""
    sft: list
    outcomes: list[list]
    runs: list[list[dict]]
    dirs: list[list[Path]]


def run_configs(config: Path, root: Path, seeds: list[int], sft_runs: list[Path],
                configs: list[tuple[str, list[str]]], prefix: str, budget: list[str]) -> Done:
    """Per seed: the SFT base (a run of phases [demos, sft, eval], or the `sft_runs` one),
    then each configuration's run of phases [rl, eval] from it, named PREFIX-i-seedS under
    `root`; one that finished there before is taken as it is (resume). `budget`: the RL
    budget overrides every configuration shares."""
    sft: list = []
    done = Done(sft, [[] for _ in configs], [[] for _ in configs], [[] for _ in configs])
    for k, seed in enumerate(seeds):
        tag = f"run.seed={seed}"
        if sft_runs:
            base_dir, base = sft_runs[k], sft_summary(sft_runs[k])
        else:
            base_dir = root / f"sft-seed{seed}"
            base = finished_sft(base_dir) or one_run(config, root, f"sft-seed{seed}", [tag, "run.phases=[demos, sft, eval]"])
        sft += sampled(load_outcomes(base_dir / "eval" / "sft.json"), seed)
        common = [tag, "run.phases=[rl, eval]", f"policy.hf_dir={base['sft_export']}", *budget,
                  f"data.pool.import_paths=[{(base_dir / 'data' / 'demos').resolve()}]"]
        for i, (_, overrides) in enumerate(configs):
            name = f"{prefix}-{i}-seed{seed}"
            summary = finished(root / name) or one_run(config, root, name, [*common, *overrides])
            done.outcomes[i].extend(sampled(load_outcomes(root / name / "eval" / "rl.json"), seed))
            done.dirs[i].append(root / name)
            done.runs[i].append({"seed": seed, "rl_steps": summary["rl_steps"], "stalled": summary["rl_stalled"],
                                 "out_of_time": summary["rl_out_of_time"], "collapsed": summary["rl_collapsed"],
                                 "collapsed_version": summary["rl_collapsed_version"]})
    return done


def finished_sft(run_dir: Path) -> dict | None:
    """The summary of an SFT base run that finished (resume), or None."""
    try:
        return sft_summary(run_dir)
    except SystemExit:
        return None


def add_arguments(ap: argparse.ArgumentParser, config: str, seeds: list[int]) -> None:
    """The command line the ablation and the curation benchmark share."""
    ap.add_argument("--config", type=Path, default=Path(config))
    ap.add_argument("--steps", type=int, help="trainer steps per configuration (default: the config's trainer.steps)")
    ap.add_argument("--max-seconds", type=float, help="the RL phase's wall-clock budget per configuration "
                    "(default: the config's trainer.max_seconds; 0: none)")
    ap.add_argument("--seed", type=int, nargs="+", default=seeds, help="run.seed of every run; several: "
                    "every configuration once per seed, the rows pooled over them")
    ap.add_argument("--sft-run", type=Path, action="append", default=[], help="a finished run of the same "
                    "config and seed whose demos, SFT policy and SFT evaluation every configuration starts from "
                    "(default: run them); once per --seed, in the same order")
    ap.add_argument("--batch-wait-s", type=float, default=300.0, help="a configuration whose trainer waits "
                    "this long for one batch stops there (its row says stalled)")
    ap.add_argument("--work", default=None, help="where the runs go; finished ones there are not run again")


@dataclasses.dataclass(frozen=True)
class Setup:
    root: Path
    cfg: RunConfig
    steps: int
    budget: float | None  # the RL phase's seconds (None: no clock)

    def overrides(self, batch_wait_s: float) -> list[str]:
        return [f"trainer.steps={self.steps}", f"trainer.batch_wait_s={batch_wait_s}",
                f"trainer.max_seconds={'null' if self.budget is None else self.budget}"]


def setup(ap: argparse.ArgumentParser, args: argparse.Namespace, prefix: str) -> Setup:
    """Checks the shared arguments, makes SIGTERM unwind the runs, and resolves the budget."""
    if args.sft_run and len(args.sft_run) != len(args.seed):
        ap.error(f"--sft-run given {len(args.sft_run)} times for {len(args.seed)} seeds")
    stop_on_sigterm()  # killed, its runs' roles go with it (a stalled configuration is killed by hand)
    root = Path(args.work or tempfile.mkdtemp(prefix=prefix))
    cfg = load(RunConfig, args.config, [f"run.seed={args.seed[0]}"])
    budget = cfg.trainer.max_seconds if args.max_seconds is None else (args.max_seconds or None)
    return Setup(root, cfg, args.steps or cfg.trainer.steps, budget)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_arguments(ap, "configs/local.yaml", [1])
    args = ap.parse_args()
    s = setup(ap, args, "bench_ablation_")
    configs = [(label, variant(s.cfg, on)) for label, on in PIECES]
    done = run_configs(args.config, s.root, args.seed, args.sft_run, configs, "ablation", s.overrides(args.batch_wait_s))
    sft, outcomes, runs = done.sft, done.outcomes, done.runs
    rows = [row("SFT only", sft, sft, None, None, [])]
    rows += [row(label, outcomes[i], sft, outcomes[0] if i else None, outcomes[i - 1] if i else None, runs[i])
             for i, (label, _) in enumerate(PIECES)]
    print(table(rows))
    print(json.dumps({"benchmark": "curation_ablation", "config": str(args.config), "rl_steps": s.steps,
                      "rl_max_seconds": s.budget, "seeds": args.seed, "rows": rows, "work": str(s.root),
                      "machine": machine()}))


def table(rows: list[dict]) -> str:
    """Per configuration: RL steps per seed (stalled / clock / collapsed at version v), held-out
    success, and its gains over SFT, over plain GRPO and over the row before, paired."""
    head = (f"{'configuration':<20} {'RL steps':>22} {'held-out':>8} {'95% CI':>12} {'gain over SFT':>22} "
            f"{'over plain GRPO':>22} {'over the row before':>22}")
    lines = [head, "-" * len(head)]
    for r in rows:
        steps = ", ".join(_steps(run) for run in r["runs"]) or "0"
        lines.append(f"{r['config']:<20} {steps:>22} {r['success']:>8.3f} {_ci(r['ci95']):>12} "
                     + " ".join(f"{_gain(r[k], r[f'{k}_ci95']):>22}" for k in ("gain", "over_plain", "over_previous")))
    return "\n".join(lines)


def _steps(run: dict) -> str:
    marks = [m for m, on in (("stalled", run["stalled"]), ("time", run["out_of_time"])) if on]
    marks += [f"collapsed v{run['collapsed_version']}"] if run["collapsed"] else []
    return f"{run['rl_steps']}" + (f" ({', '.join(marks)})" if marks else "")


def _gain(g, ci) -> str:
    return "-" if g is None else f"{g:+.3f} {_ci(ci)}"


def _ci(ci) -> str:
    return f"[{ci[0]:+.2f}, {ci[1]:+.2f}]" if ci[0] < 0 else f"[{ci[0]:.2f}, {ci[1]:.2f}]"


if __name__ == "__main__":
    main()
