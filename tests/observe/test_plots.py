"""The three plots from the recorded run (tests/run/conftest.py says how it was recorded),
from an empty run, and the pieces they are drawn from."""

import dataclasses
from pathlib import Path

import pytest
from PIL import Image

from dart_jax.observe import plots
from dart_jax.observe.records import RunReader
from dart_jax.observe.utilization import Window, extent, measure
from tests.observe.builders import rnd, traj

PNG = b"\x89PNG\r\n\x1a\n"


def check_png(path: Path, width: int, min_height: int, max_height: int) -> Image.Image:
    assert path.read_bytes()[:8] == PNG
    image = Image.open(path)
    image.verify()
    image = Image.open(path).convert("RGB")
    assert image.width == width and min_height <= image.height <= max_height, image.size
    assert len(image.getcolors(maxcolors=1 << 16) or range(1 << 16)) > 20  # drawn, not blank
    return image


def test_render_writes_three_sane_pngs_from_the_recorded_run(recorded):
    paths = plots.render(recorded)
    assert [p.relative_to(recorded).as_posix() for p in paths] == [
        "plots/success.png", "plots/timeline.png", "plots/staleness.png"]
    check_png(paths[0], 1440, 500, 600)
    # trainer + 2 workers + 8 slots: 1.6 in + 0.3 in a lane, at 120 dpi
    check_png(paths[1], 1440, int((1.6 + 0.3 * 11) * 120) - 2, int((1.6 + 0.3 * 11) * 120) + 2)
    check_png(paths[2], 840, 470, 490)


def test_render_an_empty_run_says_so(tmp_path):
    paths = plots.render(tmp_path / "run")
    assert all(p.read_bytes()[:8] == PNG for p in paths)


def test_timeline_lanes_carry_the_utilization_figures(recorded):
    records = RunReader(recorded).refresh()
    window = extent(records)
    u = measure(records, window, num_slots=8)
    drawn = plots.trainer_lane(records, window) + plots.worker_lanes(records, window)
    lanes = {lane.label: lane.busy for lane in drawn + plots.slot_lanes(records, window, ())}
    assert lanes["trainer"] == pytest.approx(u.trainer)
    assert [lanes["worker w0"], lanes["worker w1"]] == [pytest.approx(u.per_worker[w]) for w in ("w0", "w1")]
    slots = [v for k, v in lanes.items() if k.startswith("slot")]
    assert len(slots) == 8 and sum(slots) / 8 == pytest.approx(u.env)


def test_sixteen_slots_and_idle_ones_get_lanes(tmp_path):
    """16 slots on two servers, the last idle: every one has a lane, labelled by server."""
    slots = [f"tcp://h{s}:1#{i}" for s in (0, 1) for i in range(8)]
    trajs = tuple(traj(slot, f"w{i % 4}", reset=(i, i + 0.1), steps=[((i + 0.1, i + 1), (i + 1, i + 1.1))],
                       created=i + 1.2) for i, slot in enumerate(slots[:-1]))
    records = dataclasses.replace(RunReader(tmp_path).records, trajectories=trajs,
                                  rounds=(rnd(1, 0, 2, 5, 6),))
    lanes = plots.slot_lanes(records, Window(0, 17), slots)
    assert [lane.label for lane in lanes][:2] == ["env 0 #0", "env 0 #1"]
    assert lanes[-1].label == "env 1 #7" and lanes[-1].busy == 0.0
    fig = plots.timeline_figure(records, plots.Clock.of(records), slots)
    path = plots._save(fig, tmp_path / "timeline16.png")
    check_png(path, 1440, int((1.6 + 0.3 * 21) * 120) - 2, int((1.6 + 0.3 * 21) * 120) + 2)


def test_slot_label():
    assert plots.slot_label("tcp://a:1#3", ["tcp://a:1#3", "tcp://a:1#0"]) == "slot 3"
    assert plots.slot_label("tcp://b:1#3", ["tcp://b:1#3", "tcp://a:1#0"]) == "env 1 #3"


def test_rolling_success_over_train_rollouts():
    wins = [1, 0, 0, 1, 1, 1, 0, 1]
    trajs = [traj(reset=(i, i), status="success" if w else "failure", created=float(i)) for i, w in enumerate(wins)]
    trajs += [traj(status="env_error", created=2.5), traj(task="e0", split="eval", status="success", created=3.5)]
    times, rates, k = plots.rolling_success(trajs)
    assert k == 5  # at least 5
    # from the 5th rollout on: means of wins[0:5], wins[1:6], wins[2:7], wins[3:8]
    assert times == [4.0, 5.0, 6.0, 7.0]
    assert rates == [pytest.approx(x) for x in (3 / 5, 3 / 5, 3 / 5, 4 / 5)]
    assert plots.rolling_success(trajs[:3]) == ([2.0], [pytest.approx(1 / 3)], 5)  # fewer than k: all of them


def test_the_success_plot_shows_the_evaluation_after_rl_beside_the_one_before():
    """The evaluation after RL ends after the run's last rollout: the plot's time axis runs to
    it, so both held-out points are drawn inside the axes."""
    from dart_jax.observe.records import EvalResult, RunRecords
    trajs = tuple(traj(reset=(i, i + 0.5), steps=[((i + 0.5, i + 1), (i + 1, i + 1.5))], status="success",
                       created=i + 2) for i in range(0, 100, 10))
    evals = (EvalResult("sft", "sampled", 5.0, 0.44, 140, (0.36, 0.52)),
             EvalResult("rl", "sampled", 170.0, 0.80, 140, (0.73, 0.86)))
    records = RunRecords(trajectories=trajs, evals=evals)
    assert plots.Clock.of(records).window.end < 170.0  # the records alone end before it
    clock = plots.Clock.of(records, evals=True)
    ax = plots.success_figure(records).axes[0]
    (points,) = [c for c in ax.containers]  # the sampled evaluations' error bars
    xs, ys = points.lines[0].get_data()
    assert list(ys) == [0.44, 0.80]
    lo, hi = ax.get_xlim()
    assert all(lo <= x < hi for x in xs) and xs[1] == pytest.approx(clock.x(170.0))
