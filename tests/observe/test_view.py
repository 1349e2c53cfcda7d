"""The live view: snapshots from records and the data manager's and env servers' stats,
rendered on a recording console, live on a terminal and as lines elsewhere."""

import dataclasses
import io

import pytest
from rich.console import Console

from dart_jax.observe.learning import Collapse
from dart_jax.observe.records import BatchRecord, RunReader, RunRecords, StepTiming, WorkerSync
from dart_jax.observe.view import LiveView, Rate, Snapshot, snapshot
from dart_jax.wire.messages import DataStats, EnvSlotStats, EnvStats, TaskStats
from tests.observe.builders import rnd, traj


def task_stats(task_id: str, split: str, unused: int) -> TaskStats:
    return TaskStats(task_id=task_id, split=split, attempts=0, successes=0, env_errors=0, success_rate=0.0,
                     recent_success_rate=0.0, rollouts=8, max_steps=30, mean_steps=0.0, mean_success_steps=0.0,
                     min_version=0, max_version=0, unused=unused, pool=0)


def slot_stats(busy_s: float, wall_s: float) -> EnvSlotStats:
    return EnvSlotStats(slot=0, backend="synthetic", state="leased", wall_s=wall_s, busy_s=busy_s,
                        utilization=busy_s / wall_s, episodes=1, steps=1, env_errors=0, restarts=0)


STATS = DataStats(tasks=[task_stats("t0", "train", 5), task_stats("t1", "train", 2), task_stats("e0", "eval", 9)],
                  trajectories=40, steps=200, batches=3, pool=1, latest_version=7)


def records() -> RunRecords:
    """Over [0, 100): w0 generates (40, 70) and (80, 90); the trainer updates (60, 75);
    train rollouts 1, 0, 1, 1 (+ an env error and an eval rollout, left out); w1 synced to 6."""
    trajs = (traj("e#0", "w0", reset=(39, 40), steps=[((40, 70), (70, 71))], status="success", created=72),
             traj("e#1", "w0", reset=(79, 80), steps=[((80, 90), (90, 91))], status="failure", created=92),
             traj("e#0", "w0", status="success", created=93), traj("e#0", "w0", status="success", created=94),
             traj("e#0", "w0", status="env_error", created=95),
             traj("e#0", "w0", task="e0", split="eval", status="success", created=96))
    return RunRecords(trajectories=trajs, rounds=(rnd(1, 50, 60, 74, 75, version=6),),
                      batches=tuple(BatchRecord(b, 5, 0.0, 2, 4, (0, 1, b % 3)) for b in range(1, 11)),
                      syncs=(WorkerSync("w1", 6, True, 1, 2, 3), WorkerSync("w1", 9, False, 4, 0, 0)))


def test_snapshot_from_records_and_stats():
    env = EnvStats(slots=[slot_stats(3, 10), slot_stats(1, 10)], uptime_s=10)
    snap = snapshot(records(), STATS, [env], now=100.0, num_slots=2, workers=["w0", "w1", "w2"], window_s=60)
    assert (snap.trainer_step, snap.policy_version) == (1, 7)  # the data manager has seen 7
    assert snap.worker_versions == {"w0": 0, "w1": 6, "w2": -1}  # w0 from its steps, w1 from its good sync
    assert (snap.success, snap.mean_reward, snap.recent) == (0.75, 0.75, 4)
    assert (snap.trajectories, snap.unused, snap.batches) == (40, 7, 3)  # eval rollouts never wait for training
    # last 8 batches (3..10): staleness 0, 1 and b % 3 each
    extra = [b % 3 for b in range(3, 11)]
    assert snap.staleness_mean == pytest.approx((8 + sum(extra)) / 24) and snap.staleness_max == 2
    assert snap.env == pytest.approx(4 / 20)  # the servers' own figure
    # window [40, 100): w0 (40,70) + (80,90) = 40 s, w1 and w2 idle; trainer (60,75) = 15 s
    assert snap.rollout == pytest.approx(40 / 60 / 3)
    assert snap.trainer == pytest.approx(15 / 60)


def test_snapshot_without_stats_reads_the_records():
    snap = snapshot(records(), now=100.0, num_slots=2, window_s=60)
    assert (snap.policy_version, snap.trajectories, snap.unused, snap.batches) == (6, 6, None, 10)
    # env calls in [40, 100): e#0 (70,71); e#1 (79,80) + (90,91); over 2 slots
    assert snap.env == pytest.approx(3 / 120)


def test_snapshot_of_a_young_run_measures_since_its_first_record():
    snap = snapshot(records(), now=100.0, num_slots=2, window_s=600)
    assert snap.trainer == pytest.approx(15 / (100 - 1))  # the first record: w1's sync at 1
    assert snap.window_s == 99
    # a run older than the window: [80, 100), w0 generates (80, 90), w1 idle, the trainer too
    snap = snapshot(records(), now=100.0, num_slots=2, window_s=20)
    assert (snap.rollout, snap.trainer) == (pytest.approx((10 / 20 + 0) / 2), 0.0)
    empty = snapshot(RunRecords(), now=5.0, num_slots=2)
    assert (empty.env, empty.rollout, empty.success, empty.staleness_mean, empty.policy_version) == (
        None, None, None, None, -1)


def snap(time: float, step: int, **kw) -> Snapshot:
    base = dict(time=time, trainer_step=step, policy_version=step, worker_versions={"w0": step, "w1": step - 1},
                success=0.42, mean_reward=0.5, recent=64, trajectories=1234, unused=37, batches=step,
                staleness_mean=0.61, staleness_max=2, env=0.613, rollout=0.45, trainer=0.3, window_s=60.0)
    return Snapshot(**base | kw)


def test_rate_and_eta_over_recent_snapshots():
    rate = Rate(horizon_s=300)
    for t, s in [(0, 0), (100, 1), (400, 10), (500, 20)]:
        rate.add(t, s)
    # the base is the newest sample at least 300 s older than the last: (100, 1) once (400, 10) came
    assert rate.per_s() == pytest.approx((20 - 1) / (500 - 100))
    view = LiveView(100, console=Console(file=io.StringIO()))
    view.rate.add(0.0, 0)
    assert view.eta_s(snap(0.0, 0)) is None  # no rate yet
    view.rate.add(600.0, 20)
    assert view.eta_s(snap(600.0, 20)) == pytest.approx(80 / (20 / 600))
    with pytest.raises(ValueError):
        LiveView(0)


def test_eta_ends_with_the_trainers_budget_when_that_comes_first():
    view = LiveView(100, console=Console(file=io.StringIO()), budget_s=900.0)
    view.update(snap(1000.0, 0))  # the budget counts from the first snapshot
    assert view.eta_s(snap(1000.0, 0)) == 900.0  # no rate yet: the budget's end
    view.update(snap(1600.0, 20))
    assert view.eta_s(snap(1600.0, 20)) == pytest.approx(300.0)  # steps would take 2400 s more
    view.update(snap(1700.0, 90))
    assert view.eta_s(snap(1700.0, 90)) == pytest.approx(10 / (90 / 700))  # the steps end first


def test_render_shows_every_figure():
    console = Console(record=True, width=120)
    view = LiveView(100, console=console)
    view.rate.add(0.0, 0)
    view.rate.add(600.0, 30)
    console.print(view.render(snap(600.0, 30)))
    text = console.export_text()
    for part in ("dart-jax run", "step 30/100", "30%", "3.0 steps/min", "ETA 0:23:20", "trainer v30",
                 "w0 v30  w1 v29", "success 42%", "mean reward 0.50", "(last 64 train rollouts)",
                 "1234 trajectories", "37 fresh unused", "30 batches", "mean 0.61   max 2",
                 "env slots 61%   rollout 45%   trainer 30%   (last 60 s)"):
        assert part in text, part
    assert max(map(len, text.splitlines())) <= 120


def test_live_on_a_terminal_redraws_the_panel():
    console = Console(record=True, width=120, force_terminal=True, file=io.StringIO())
    with LiveView(100, console=console) as view:
        view.update(snap(0.0, 1))
        view.update(snap(2.0, 2))
    text = console.export_text()
    assert "step 2/100" in text and "dart-jax run" in text


def test_not_a_terminal_prints_a_line_every_interval():
    out = io.StringIO()
    with LiveView(100, console=Console(file=out, width=120), every_s=10.0) as view:
        for t, step in [(0.0, 0), (5.0, 1), (10.0, 2), (12.0, 3), (21.0, 4)]:
            view.update(snap(t, step))
    lines = out.getvalue().splitlines()
    assert [line.split(" ETA")[0] for line in lines] == ["step 0/100", "step 2/100", "step 4/100"]
    # 4 steps in 21 s: 96 more take 504 s
    assert lines[-1] == ("step 4/100 ETA 0:08:24 | v4 [w0:v4 w1:v3] | success 42% reward 0.50 (last 64) | "
                         "unused 37 batches 4 staleness 0.61/2 | busy 60s: env 61% rollout 45% trainer 30%")


def test_snapshot_of_the_recorded_run_reads_as_a_run(recorded):
    records = RunReader(recorded).refresh()
    s = snapshot(records, now=records.rounds[-1].publish_end, num_slots=8)
    assert s.trainer_step == records.rounds[-1].step and s.policy_version == records.rounds[-1].policy_version
    assert set(s.worker_versions) == {"w0", "w1"}
    assert all(0 <= v <= s.policy_version for v in s.worker_versions.values())
    assert all(0 < x < 1 for x in (s.env, s.rollout, s.trainer))
    assert 0 <= s.success <= 1 and s.recent == 64


def test_a_collapse_of_the_training_rollouts_shows_in_the_line_and_the_panel():
    """256 successes at versions 0-3, then failures from version 4: the window of the last 256
    falls to 0.65 of its best at the 90th failure (166 of 256), a rollout of version 5."""
    trajs = tuple(dataclasses.replace(traj(status="success" if i < 256 else "failure", created=float(i)),
                                      steps=(StepTiming(policy_version=i // 64),)) for i in range(400))
    steady = snapshot(RunRecords(trajectories=trajs[:300]), now=400.0, num_slots=2)
    assert steady.collapse is None
    fallen = snapshot(RunRecords(trajectories=trajs), now=400.0, num_slots=2)
    assert fallen.collapse == Collapse(version=5, success=166 / 256, best=1.0, best_version=3)
    out = io.StringIO()
    with LiveView(100, console=Console(file=out, width=400)) as view:
        view.update(fallen)
    want = "COLLAPSED at v5: success 65% of the last 256 train rollouts, 35% or more below its best 100% (v3)"
    assert out.getvalue().rstrip().endswith("| " + want)
    console = Console(record=True, width=140)
    console.print(view.render(fallen))
    text = console.export_text()
    assert "collapse" in text and want in text
    assert "COLLAPSED" not in view.line(steady)
