"""DART's curation ablation on the local learning proof: one SFT policy, then each curation
piece added in turn, with the same seeds and the same RL budget per configuration.

    .venv/bin/python -m benchmarks.curation_ablation [--config configs/local.yaml] [--steps N] [--seed S]
                                                     [--max-seconds S] [--sft-run RUN_DIR] [--batch-wait-s S]

A `dart-jax run` of the config's demos, sft and eval phases gives the SFT policy and its
held-out success (or `--sft-run`: those phases of a finished run of the same config and seed,
such as a `make run`, whose RL phase then is the `full` configuration's twin). Each
configuration is then a run of phases [rl, eval] from that policy with the same tasks,
demonstrations, seeds, RL budget (the config's `train.steps` and `train.max_seconds`,
whichever ends first, as in `make run`) and evaluation episodes:

    plain GRPO           fixed max_rollouts per task, fixed step cap (default_max_steps), no
                         experience pool, every step trained, no truncated importance sampling
    + dynamic rollouts   rollouts per task from its recent success rate
    + dynamic length     step cap per task from its successful lengths
    + entropy selection  only the top fraction of steps by token entropy trained
    + TIS                truncated importance sampling against the engine's log-probs
    full                 + the experience pool (a group without a success takes a stored one)

A configuration whose trainer gets no batch for `--batch-wait-s` seconds (its rollouts give
nothing to learn from: every group failed and no pool fills in) stops at the step it
reached and is evaluated there; its row says so, as it says which configurations the clock
stopped.

Printed as DART's ablation table (RL steps trained, held-out success with Wilson 95%
intervals, and the gain over SFT paired over the same eval episodes) and as JSON on the
last line.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from benchmarks.common import machine, socket_overrides

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
    from dart_jax.config import load
    from dart_jax.run.main import run
    from dart_jax.config.schema import RunConfig
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


def main() -> None:
    from dart_jax.config import load
    from dart_jax.eval.stats import load_outcomes, paired_gain, wilson
    from dart_jax.run.main import stop_on_sigterm
    from dart_jax.config.schema import RunConfig
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", type=Path, default=Path("configs/local.yaml"))
    ap.add_argument("--steps", type=int, help="trainer steps per configuration (default: the config's train.steps)")
    ap.add_argument("--max-seconds", type=float, help="the RL phase's wall-clock budget per configuration "
                    "(default: the config's train.max_seconds; 0: none)")
    ap.add_argument("--seed", type=int, default=1, help="run.seed of every run")
    ap.add_argument("--sft-run", type=Path, help="a finished run of the same config and seed whose demos, "
                    "SFT policy and SFT evaluation every configuration starts from (default: run them)")
    ap.add_argument("--batch-wait-s", type=float, default=300.0, help="a configuration whose trainer waits "
                    "this long for one batch stops there (its row says stalled)")
    ap.add_argument("--work", default=None)
    args = ap.parse_args()
    stop_on_sigterm()  # killed, its runs' roles go with it (a stalled configuration is killed by hand)
    root = Path(args.work or tempfile.mkdtemp(prefix="bench_ablation_"))
    seed = [f"run.seed={args.seed}"]
    cfg = load(RunConfig, args.config, seed)
    steps = args.steps or cfg.train.steps
    budget = cfg.train.max_seconds if args.max_seconds is None else (args.max_seconds or None)

    if args.sft_run:
        base_dir, base = args.sft_run, sft_summary(args.sft_run)
    else:
        base_dir, base = root / "sft", one_run(args.config, root, "sft", [*seed, "run.phases=[demos, sft, eval]"])
    sft_eval = load_outcomes(base_dir / "eval" / "sft.json")
    rows = [{"config": "SFT only", "success": base["heldout_success_sft"], "n": _sampled(sft_eval)[1],
             "ci95": list(wilson(*_sampled(sft_eval))), "gain": 0.0, "gain_ci95": [0.0, 0.0],
             "rl_steps": 0, "stalled": False, "out_of_time": False}]
    common = [*seed, "run.phases=[rl, eval]", f"policy.hf_dir={base['sft_export']}", f"train.steps={steps}",
              f"train.batch_wait_s={args.batch_wait_s}", f"train.max_seconds={'null' if budget is None else budget}",
              f"data.pool.import_paths=[{(base_dir / 'data' / 'demos').resolve()}]"]
    for i, (label, on) in enumerate(PIECES):
        name = f"ablation-{i}"
        summary = one_run(args.config, root, name, [*common, *variant(cfg, on)])
        outcomes = load_outcomes(root / name / "eval" / "rl.json")
        wins, n = _sampled(outcomes)
        g = paired_gain([o for o in sft_eval if o.mode == "sampled"], [o for o in outcomes if o.mode == "sampled"])
        rows.append({"config": label, "success": wins / n, "n": n, "ci95": list(wilson(wins, n)),
                     "gain": g["gain"], "gain_ci95": g["ci95"], "rl_steps": summary["rl_steps"],
                     "stalled": summary["rl_stalled"], "out_of_time": summary["rl_out_of_time"]})
    print(table(rows))
    print(json.dumps({"benchmark": "curation_ablation", "config": str(args.config), "rl_steps": steps,
                      "rl_max_seconds": budget,
                      "seed": args.seed, "rows": rows, "work": str(root), "machine": machine()}))


def _sampled(outcomes) -> tuple[int, int]:
    mine = [o for o in outcomes if o.mode == "sampled"]
    return sum(o.success for o in mine), len(mine)


def table(rows: list[dict]) -> str:
    head = (f"{'configuration':<22} {'RL steps':>14} {'held-out success':>18} {'95% CI':>16} "
            f"{'gain over SFT':>14} {'paired 95% CI':>18}")
    lines = [head, "-" * len(head)]
    for r in rows:
        steps = f"{r['rl_steps']}" + (" (stalled)" if r["stalled"] else " (time)" if r["out_of_time"] else "")
        lines.append(f"{r['config']:<22} {steps:>14} {r['success']:>18.3f} {_ci(r['ci95']):>16} {r['gain']:>+14.3f} "
                     f"{_ci(r['gain_ci95']):>18}")
    return "\n".join(lines)


def _ci(ci) -> str:
    return f"[{ci[0]:+.2f}, {ci[1]:+.2f}]" if ci[0] < 0 else f"[{ci[0]:.2f}, {ci[1]:.2f}]"


if __name__ == "__main__":
    main()
