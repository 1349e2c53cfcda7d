"""The learning proof, run after run: `make run`'s configuration N times in a row, each a real
`dart-jax run` (demos, SFT, eval, RL, eval), and how many meet the bar.

    .venv/bin/python -m benchmarks.experiments.learning_sweep [--runs N] [--seed S | --first-seed S]
                                                  [--config configs/local.yaml] [--work DIR] [--set KEY=VALUE ...]
                                                  [--records DIR | --no-records]

Run i has run.seed = i (seeds 0..N-1), or first-seed + i (`--first-seed S`: fresh seeds), or
`--seed S` for N repeats of one seed (an asynchronous run is not deterministic: a repeat is
another draw). `--set` adds a dotted
override to every run. Per run it prints SFT's and RL's held-out success (sampled), the gain
and its paired 95% interval (clustered by held-out task), the lowest training-rollout success (the mean of the last 256
train rollouts, dart_jax/observe/learning.py) after it first reached the SFT policy's
held-out success, whether training collapsed by the run's rule (`rl_collapsed`: a window fell
35% below its best, or the last two versions' rollouts below half of it, either at least 0.10
below; observe/learning.py)
and at which policy version, and the wall time; then the pass rate and a JSON line. Each
finished run leaves a record in `--records` (benchmarks/results/learning_sweep, kept in the
repository: records.py), and a run recorded there under the same config text, overrides and bar
is read back, not run: the runs of a sweep can be measured over several sittings.

The bar (issues 30, 42): heldout_gain >= 0.20, the interval's low end > 0, SFT success within
0.05..0.70, no collapse, and the run under 20 minutes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence

from benchmarks.common import commit, machine, socket_overrides
from benchmarks.experiments import records
from dart_jax.config import load
from dart_jax.run.schema import RunConfig
from dart_jax.observe.learning import lowest_after, success_curve
from dart_jax.observe.records import RunReader
from dart_jax.run.main import run, stop_on_sigterm


RECORDS = Path("benchmarks/results/learning_sweep")  # each finished run's record, kept in the repository


@dataclasses.dataclass(frozen=True)
class Bar:
    min_gain: float = 0.20
    sft_range: tuple[float, float] = (0.05, 0.70)
    max_wall_s: float = 20 * 60


@dataclasses.dataclass(frozen=True)
class Row:
    run: str
    seed: int
    sft: float
    rl: float
    gain: float
    gain_ci95: tuple[float, float]
    low_after_sft: float | None  # None: the training rollouts never reached the SFT level
    collapsed: bool
    collapsed_version: int | None
    rl_steps: int
    wall_s: float
    meets_bar: bool


def seeds(runs: int, seed: int | None, first: int = 0) -> list[int]:
    """first..first+runs-1, or `seed` repeated `runs` times."""
    return [seed] * runs if seed is not None else list(range(first, first + runs))


def row(name: str, seed: int, summary: dict, low_after_sft: float | None, wall_s: float, bar: Bar = Bar()) -> Row:
    sft, gain, ci = summary["heldout_success_sft"], summary["heldout_gain"], tuple(summary["heldout_gain_ci95"])
    meets = (gain >= bar.min_gain and ci[0] > 0 and bar.sft_range[0] <= sft <= bar.sft_range[1]
             and not summary["rl_collapsed"] and wall_s < bar.max_wall_s)
    return Row(name, seed, sft, summary["heldout_success_rl"], gain, ci, low_after_sft, summary["rl_collapsed"],
               summary["rl_collapsed_version"], summary["rl_steps"], round(wall_s, 1), meets)


def low_after_sft(run_dir: Path, db_path: str, sft: float) -> float | None:
    """The lowest rolling training-rollout success once it first reached `sft`."""
    reader = RunReader(run_dir, db_path)
    try:
        return lowest_after(success_curve(reader.refresh().trajectories), sft)
    finally:
        reader.close()


def one_run(config: Path, root: Path, name: str, seed: int, extra: Sequence[str]) -> tuple[dict, float]:
    """A whole `dart-jax run` in this process: (its summary, wall seconds)."""
    start = time.monotonic()
    summary = run(load(RunConfig, config, [f"run.root={root}", f"run.name={name}", "run.view=lines",
                                           f"run.seed={seed}", *socket_overrides(root, name), *extra]))
    return summary, time.monotonic() - start


Runner = Callable[[Path, Path, str, int, Sequence[str]], tuple[dict, float]]


def sweep(config: Path, root: Path, run_seeds: Sequence[int], extra: Sequence[str], runner: Runner = one_run,
          db_path: str = "data/store.sqlite", bar: Bar = Bar(), kept: Path | None = None) -> list[Row]:
    """Every run in turn, one JSON line each as it ends. With `kept` (a folder), each finished
    run leaves a record there (records.py) and a run recorded under the same settings is read
    back instead of run: a sweep of 6 runs is about 75 min, measured over several sittings."""
    setting = records.settings(config, list(extra), bar=dataclasses.asdict(bar))
    rows = []
    for i, seed in enumerate(run_seeds):
        name = f"sweep-{i}-seed{seed}"
        ident, path = {"run": name, "seed": seed}, kept / f"{name}.json" if kept else None
        body = records.read(path, "learning_sweep", ident, setting) if path else None
        if body is None:
            print(f"run {i + 1} of {len(run_seeds)}: {name} under {root}", file=sys.stderr, flush=True)
            summary, wall_s = runner(config, root, name, seed, extra)
            r = row(name, seed, summary, low_after_sft(root / name, db_path, summary["heldout_success_sft"]), wall_s, bar)
            if path:
                records.write(path, "learning_sweep", ident, setting, {"row": dataclasses.asdict(r)})
        else:
            try:
                r = Row(**body["row"] | {"gain_ci95": tuple(body["row"]["gain_ci95"])})
            except (KeyError, TypeError, ValueError) as e:
                raise records.RecordError(f"{path}: its row is not a sweep row ({type(e).__name__}: {e})") from None
            print(f"run {i + 1} of {len(run_seeds)}: {name} recorded at {body['commit']} ({body['written']})",
                  file=sys.stderr, flush=True)
        print(json.dumps({"sweep_run": dataclasses.asdict(r)}), flush=True)
        rows.append(r)
    return rows


def table(rows: Sequence[Row]) -> str:
    head = (f"{'run':<18} {'seed':>4} {'SFT':>6} {'RL':>6} {'gain':>7} {'paired 95% CI':>17} {'low after SFT':>13} "
            f"{'collapsed':>10} {'steps':>5} {'wall':>9} {'bar':>4}")
    lines = [head, "-" * len(head)]
    for r in rows:
        low = "never" if r.low_after_sft is None else f"{r.low_after_sft:.3f}"
        collapsed = f"v{r.collapsed_version}" if r.collapsed else "no"
        lines.append(f"{r.run:<18} {r.seed:>4} {r.sft:>6.3f} {r.rl:>6.3f} {r.gain:>+7.3f} "
                     f"{f'[{r.gain_ci95[0]:+.3f}, {r.gain_ci95[1]:+.3f}]':>17} {low:>13} {collapsed:>10} "
                     f"{r.rl_steps:>5} {r.wall_s / 60:>7.1f} m {'yes' if r.meets_bar else 'no':>4}")
    passed = sum(r.meets_bar for r in rows)
    lines.append(f"{passed} of {len(rows)} runs meet the bar; {sum(r.collapsed for r in rows)} collapsed")
    return "\n".join(lines)


def report(rows: Sequence[Row], config: Path, extra: Sequence[str], root: Path, bar: Bar = Bar()) -> dict:
    return {"benchmark": "learning_sweep", "config": str(config), "overrides": list(extra), "commit": commit(),
            "bar": dataclasses.asdict(bar), "runs": [dataclasses.asdict(r) for r in rows],
            "passed": sum(r.meets_bar for r in rows), "collapsed": sum(r.collapsed for r in rows),
            "pass_rate": sum(r.meets_bar for r in rows) / len(rows) if rows else None,
            "work": str(root), "machine": machine()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=6)
    ap.add_argument("--seed", type=int, help="repeat this seed --runs times (default: seeds 0..runs-1)")
    ap.add_argument("--first-seed", type=int, default=0, help="seeds first..first+runs-1 (fresh seeds)")
    ap.add_argument("--config", type=Path, default=Path("configs/local.yaml"))
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="an override for every run")
    ap.add_argument("--work", default=None)
    ap.add_argument("--records", type=Path, default=RECORDS, help="where each finished run's record is kept and "
                    "read back (benchmarks/experiments/records.py): a run recorded there is not run again")
    ap.add_argument("--no-records", action="store_true", help="run every run, record none")
    args = ap.parse_args()
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    stop_on_sigterm()  # killed, its runs' roles go with it
    root = Path(args.work or tempfile.mkdtemp(prefix="bench_sweep_")).resolve()
    db_path = load(RunConfig, args.config, args.set).data.store.db_path
    kept = None if args.no_records else args.records
    try:
        rows = sweep(args.config, root, seeds(args.runs, args.seed, args.first_seed), args.set, db_path=db_path, kept=kept)
    except records.RecordError as e:
        ap.error(str(e))
    print(table(rows))
    print(json.dumps(report(rows, args.config, args.set, root)))


if __name__ == "__main__":
    main()
