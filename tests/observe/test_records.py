"""The run reader: typed records from a real store and real log files, read incrementally."""

import dataclasses
import json
import sqlite3

import msgspec
import pytest

from dart_jax.data.curation import Group, TrajRecord
from dart_jax.data.store import Store
from dart_jax.testing.trajectories import make_trajectory, put, task_specs
from dart_jax.observe import records
from dart_jax.eval.stats import Outcome, report, wilson
from dart_jax.observe.records import RunReader, StepTiming
from dart_jax.rundir import MetricsWriter, RunDir
from dart_jax.wire.messages import Step, Trajectory


@pytest.fixture
def run(tmp_path):
    run = RunDir.create(tmp_path / "run")
    store = Store(run.data / "store.sqlite", run.data / "blobs")
    store.upsert_tasks(task_specs(n_train=2, n_eval=1))
    yield run, store
    store.close()


def stamped(traj_id, task_id="t0", version=3, t0=100.0, slot="tcp://127.0.0.1:9#1", **kw) -> Trajectory:
    """A stored-shape trajectory whose step i generates over [t0+2i, t0+2i+1) and steps the env
    over [t0+2i+1, t0+2i+1.5)."""
    traj = make_trajectory(traj_id, task_id, version=version, **kw)
    steps = [msgspec.structs.replace(s, gen_s=(t0 + 2 * i, t0 + 2 * i + 1), env_s=(t0 + 2 * i + 1, t0 + 2 * i + 1.5),
                                     straddles_update=i == 1) for i, s in enumerate(traj.steps)]
    return msgspec.structs.replace(traj, steps=steps, env_slot=slot, reset_s=(t0 - 1, t0 - 0.5),
                                   evaluate_s=(t0 + 9, t0 + 9.5), weight_loads=[(4, t0 + 3.0, t0 + 3.2)])


def record(traj: Trajectory) -> TrajRecord:
    versions = [s.policy_version for s in traj.steps]
    return TrajRecord(traj.traj_id, traj.task_id, 0, traj.status == "success", len(traj.steps),
                      min(versions), max(versions))


def test_step_and_head_fields_are_wire_fields():
    """The reader decodes stored structs by field name: a renamed wire field must fail here."""
    assert {f.name for f in dataclasses.fields(StepTiming)} <= set(Step.__struct_fields__)
    assert {f.name for f in dataclasses.fields(records._Head)} <= set(Trajectory.__struct_fields__)


def test_trajectories_with_their_stamps(run):
    run_dir, store = run
    put(store, stamped("a", success=True, steps=2), stamped("b", "e0", version=1, steps=1))
    got = RunReader(run_dir.root).refresh().trajectories
    assert [(t.traj_id, t.split, t.success, t.source, t.worker_id) for t in got] == [
        ("a", "train", True, "rollout", "w0"), ("b", "eval", False, "rollout", "w0")]
    a = got[0]
    assert (a.env_slot, a.reset_s, a.evaluate_s, a.weight_loads) == (
        "tcp://127.0.0.1:9#1", (99.0, 99.5), (109.0, 109.5), ((4, 103.0, 103.2),))
    assert a.steps == (StepTiming((100.0, 101.0), (101.0, 101.5), 3, False),
                       StepTiming((102.0, 103.0), (103.0, 103.5), 3, True))
    assert a.ingested_at > 0 and a.seq < got[1].seq


def test_a_head_less_row_of_schema_1_reads_without_timings(run):
    run_dir, store = run
    put(store, stamped("a"))
    with store.write() as w:
        w.execute("UPDATE trajectories SET head = NULL")
    (a,) = RunReader(run_dir.root).refresh().trajectories
    assert (a.env_slot, a.reset_s, a.weight_loads, len(a.steps)) == ("", (0.0, 0.0), (), 3)


def test_refresh_reads_only_what_is_new(run):
    run_dir, store = run
    reader = RunReader(run_dir.root)
    assert reader.refresh() == records.RunRecords()
    put(store, stamped("a"), stamped("b"))
    assert [t.traj_id for t in reader.refresh().trajectories] == ["a", "b"]
    put(store, stamped("c"))
    store.record_batch(1, 4, [Group("t0", (record(stamped("a")),))])
    got = reader.refresh()
    assert [t.traj_id for t in got.trajectories] == ["a", "b", "c"]
    assert [b.batch_id for b in got.batches] == [1]
    assert reader.store.last_seq == got.trajectories[-1].seq
    assert reader.refresh() == got


def test_a_store_not_yet_there_or_not_yet_made_reads_as_empty(tmp_path):
    reader = RunReader(tmp_path / "run")
    assert reader.refresh() == records.RunRecords()  # no run directory at all
    (tmp_path / "run" / "data").mkdir(parents=True)
    sqlite3.connect(tmp_path / "run" / "data" / "store.sqlite").close()  # created, no tables yet
    assert reader.refresh() == records.RunRecords()
    store = Store(tmp_path / "run" / "data" / "store.sqlite", tmp_path / "run" / "data" / "blobs")
    store.upsert_tasks(task_specs(n_train=1))
    put(store, stamped("a"))
    assert [t.traj_id for t in reader.refresh().trajectories] == ["a"]
    store.close()


def test_batches_count_all_steps_and_the_staleness_of_their_own(run):
    run_dir, store = run
    own, pooled = stamped("a", version=3, steps=2), stamped("p", version=0, steps=4, source="pool")
    put(store, own, pooled)
    store.record_batch(1, 5, [Group("t0", (record(own), record(pooled)), injected=("p",))])
    (b,) = RunReader(run_dir.root).refresh().batches
    assert (b.batch_id, b.trainer_version, b.trajectories, b.steps, b.staleness) == (1, 5, 2, 6, (2, 2))


def test_trainer_rounds_skip_sft_lines_and_wait_for_a_whole_line(run):
    run_dir, _ = run
    log = MetricsWriter(run_dir.metrics_path("trainer"))
    log.write(10, {"loss/nll": 1.0})  # SFT: no round stamps
    stamps = {"time/fetch_start": 1.0, "time/update_start": 2.0, "time/publish_start": 3.0, "time/publish_end": 4.0}
    log.write(11, {"policy/version": 1, "batch/id": 1, **stamps})
    reader = RunReader(run_dir.root)
    with run_dir.metrics_path("trainer").open("a") as f:
        f.write('{"step": 12, "policy/version": 2, "batch/id": 2, ')  # a line being written
        f.flush()
        assert [r.step for r in reader.refresh().rounds] == [11]
        f.write(json.dumps(stamps)[1:] + "\n")
    assert reader.refresh().rounds[1] == records.TrainerRound(12, 2, 2, 1.0, 2.0, 3.0, 4.0)
    log.close()


def test_worker_syncs_from_each_rollout_log(run):
    run_dir, _ = run
    reader = RunReader(run_dir.root)
    for worker in ("w1", "w0"):
        log = MetricsWriter(run_dir.metrics_path(f"rollout-{worker}"))
        log.write(1, {"traj": "a", "task": "t0", "status": "success", "reward": 1.0, "steps": 2, "version": 0})
        log.write(1, {"sync_version": 1, "sync_ok": worker == "w0", "sync_started": 5.0, "sync_paused": 6.0,
                      "sync_resumed": 6.5, "sync_error": ""})
        log.close()
        reader.refresh()
    assert reader.records.syncs == (records.WorkerSync("w1", 1, False, 5.0, 6.0, 6.5),
                                    records.WorkerSync("w0", 1, True, 5.0, 6.0, 6.5))
    assert reader.records.workers() == ["w0", "w1"]


def test_eval_results_once_each_complete_file(run):
    run_dir, _ = run
    (run_dir.root / "eval").mkdir()
    outcomes = [Outcome("e0", "sampled", i, i < 2, float(i < 2), 3, "failure") for i in range(8)]
    doc = report("after-rl", run_dir.root / "export", [*outcomes, Outcome("e0", "greedy", 0, True, 1.0, 2, "success")])
    (run_dir.root / "eval" / "after-rl.json").write_text(json.dumps(doc))
    (run_dir.root / "eval" / "before.json").write_text('{"label": "before", "sam')  # still being written
    reader = RunReader(run_dir.root)
    got = reader.refresh().evals
    assert [(e.label, e.mode, e.success, e.n) for e in got] == [("after-rl", "sampled", 0.25, 8),
                                                                ("after-rl", "greedy", 1.0, 1)]
    assert got[0].ci95 == pytest.approx(wilson(2, 8)) and got[0].time == doc["time"]
    (run_dir.root / "eval" / "before.json").write_text(json.dumps(doc | {"label": "before", "time": 1.0}))
    assert [e.label for e in reader.refresh().evals] == ["before", "before", "after-rl", "after-rl"]  # by time
    assert len(reader.refresh().evals) == 4


def test_the_recorded_run_reads_whole(recorded):
    """Every record of tests/observe/data/run (see conftest.py), checked against the sources."""
    got = RunReader(recorded).refresh()
    conn = sqlite3.connect(recorded / "data" / "store.sqlite")
    (n, steps), = conn.execute("SELECT count(*), sum(num_steps) FROM trajectories")
    assert (len(got.trajectories), sum(len(t.steps) for t in got.trajectories)) == (n, steps)
    assert all(t.env_slot.startswith("tcp://127.0.0.1:5560#") and t.reset_s[1] > t.reset_s[0] > 0
               for t in got.trajectories)
    assert [(b.batch_id, b.steps) for b in got.batches] == conn.execute(
        "SELECT batch_id, sum(t.num_steps) FROM batch_items JOIN trajectories t USING (traj_id)"
        " GROUP BY batch_id ORDER BY batch_id").fetchall()
    conn.close()
    lines = [json.loads(x) for x in (recorded / "metrics" / "trainer.jsonl").read_text().splitlines()]
    assert [r.batch_id for r in got.rounds] == [x["batch/id"] for x in lines]
    syncs = sum("sync_version" in x for p in (recorded / "metrics").glob("rollout-*.jsonl")
                for x in map(json.loads, p.read_text().splitlines()))
    assert len(got.syncs) == syncs > 0
    files = list((recorded / "eval").glob("*.json"))
    assert len(got.evals) == 2 * len(files) > 0  # a sampled and a greedy result in each
