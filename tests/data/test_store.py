"""Schema, migrations, round trips, idempotent group-commit ingestion and integrity."""

import io
import sqlite3

import msgspec
import numpy as np
import pytest
from PIL import Image

from dart_jax.data import integrity, tables
from dart_jax.wire.png import address
from dart_jax.data.ingest import IngestWriter, validate
from dart_jax.data.store import ConflictError, Store
from dart_jax.testing.trajectories import make_trajectory, put, task_specs
from dart_jax.wire.messages import ScreenshotRef, TaskSpec


def test_fresh_store_is_migrated_and_in_wal_mode(store, tmp_path):
    assert tables.version(store._w) == len(tables.MIGRATIONS)
    assert store.query("PRAGMA journal_mode") == [("wal",)]
    store.close()
    again = Store(tmp_path / "data" / "store.sqlite", tmp_path / "data" / "blobs")  # idempotent
    assert tables.version(again._w) == len(tables.MIGRATIONS)
    again.close()


def test_newer_store_is_refused(tmp_path):
    conn = sqlite3.connect(tmp_path / "s.sqlite")
    conn.execute(f"PRAGMA user_version = {len(tables.MIGRATIONS) + 1}")
    conn.close()
    with pytest.raises(RuntimeError, match="newer than this build"):
        Store(tmp_path / "s.sqlite", tmp_path / "b")


def test_task_split_cannot_change(store):
    moved = [TaskSpec(task_id="e0", backend="synthetic", name="eval-0", split="train")]
    with pytest.raises(ConflictError, match="split"):
        store.upsert_tasks(moved)
    assert [t.task_id for t in store.tasks("eval")] == ["e0", "e1"]


def test_round_trip_is_exact(store):
    traj = make_trajectory("a", "t0", success=True, steps=4, version=3)
    assert put(store, traj) == [True]
    (back,) = store.load_trajectories(["a"])
    assert back.screenshots == traj.screenshots
    assert [s.image_refs for s in back.steps] == [s.image_refs for s in traj.steps]
    for a, b in zip(back.steps, traj.steps):
        np.testing.assert_array_equal(a.prompt_ids, b.prompt_ids)
        np.testing.assert_array_equal(a.logprobs, b.logprobs)
        assert a.response_text == b.response_text and a.policy_version == 3
    assert (back.reward, back.status, back.source) == (1.0, "success", "rollout")
    assert store.query("SELECT traj_id FROM pool") == [("a",)]  # successes join the pool


def test_identical_screenshots_are_stored_once(store):
    put(store, *[make_trajectory(f"s{i}", "t0", steps=5, shared_screens=2) for i in range(6)])
    assert store.query("SELECT count(*), sum(size) FROM blobs") == [(2, 512)]
    assert sum(store.blobs.sizes().values()) == 512  # each content appended once
    assert integrity.check(store, deep=True) == []


def test_writer_acks_duplicates_and_isolates_bad_rows(store):
    writer = IngestWriter(store)
    good = make_trajectory("g", "t1")
    bad = make_trajectory("b", "nope")  # a foreign key failure fails alone
    futs = [writer.submit(good, store.put_screenshots(good)),
            writer.submit(good, store.put_screenshots(good)),
            writer.submit(bad, store.put_screenshots(bad))]
    assert futs[0].result(5) is False and futs[1].result(5) is True
    with pytest.raises(sqlite3.IntegrityError):
        futs[2].result(5)
    writer.close()
    assert store.query("SELECT traj_id FROM trajectories") == [("g",)]


def test_validation_names_the_problem():
    traj = make_trajectory("x", "t0", steps=2)
    with pytest.raises(ValueError, match="unknown task"):
        validate(traj, {"t1"})
    traj.steps[1].image_refs.append(7)
    with pytest.raises(ValueError, match=r"step 1: image_refs \[7\]"):
        validate(traj, {"t0"})
    traj = make_trajectory("y", "t0", steps=1)
    traj.steps[0].logprobs = traj.steps[0].logprobs[:2]
    with pytest.raises(ValueError, match="2 logprobs for 4 tokens"):
        validate(traj, {"t0"})


def test_integrity_check_finds_missing_and_corrupt_blobs(store):
    put(store, make_trajectory("a", "t0", steps=2, screenshot_bytes=100))
    assert integrity.check(store, deep=True) == [] and integrity.orphan_bytes(store) == 0
    (first, second), pack = store.query("SELECT sha256 FROM blobs ORDER BY offset"), store.blobs.packs()[0]
    store.blobs.close()
    data = bytearray(store.blobs.path(pack).read_bytes())
    data[0] ^= 1
    store.blobs.path(pack).write_bytes(data[:150])
    assert integrity.check(store) == [f"blob {second[0]}: missing (pack 1 ends before 200)"]
    assert sorted(integrity.check(store, deep=True)) == sorted([  # listed in hash order
        f"blob {first[0]}: corrupt", f"blob {second[0]}: missing (pack 1 ends before 200)"])


def test_a_reopened_store_appends_to_a_new_pack_and_counts_orphans(store, tmp_path):
    store.put_screenshots(make_trajectory("lost", "t0", steps=1, screenshot_bytes=128))  # never committed
    put(store, make_trajectory("a", "t0", steps=1, screenshot_bytes=128))
    store.close()
    again = Store(tmp_path / "data" / "store.sqlite", tmp_path / "data" / "blobs")
    put(again, make_trajectory("b", "t0", steps=1, screenshot_bytes=128))
    assert again.blobs.packs() == [1, 2]
    assert integrity.orphan_bytes(again) == 128 and integrity.check(again, deep=True) == []
    assert again.load_trajectories(["a", "b"])[1].screenshots == make_trajectory(
        "b", "t0", steps=1, screenshot_bytes=128).screenshots
    again.close()


def test_power_durability_syncs_packs_before_commit(tmp_path):
    s = Store(tmp_path / "s.sqlite", tmp_path / "b", durability="power")
    s.upsert_tasks(task_specs(1))
    assert s.query("PRAGMA synchronous") == [(2,)]  # FULL
    writer = IngestWriter(s)
    traj = make_trajectory("a", "t0")
    assert writer.submit(traj, s.put_screenshots(traj)).result(5) is False
    writer.close()
    assert s.load_trajectories(["a"])[0].screenshots == traj.screenshots
    s.close()


def test_every_trajectory_field_round_trips(store):
    traj = msgspec.structs.replace(make_trajectory("x", "t0"), assignment_id="a1", env_slot="tcp://h:1#3",
                                   reset_s=(1.0, 2.0), evaluate_s=(3.0, 4.5), weight_loads=[(2, 5.0, 5.1)])
    put(store, traj)
    back = store.load_trajectories(["x"])[0]
    assert (back.assignment_id, back.env_slot, back.reset_s, back.evaluate_s, back.weight_loads) == \
        ("a1", "tcp://h:1#3", (1.0, 2.0), (3.0, 4.5), [(2, 5.0, 5.1)])


def test_a_schema_1_store_migrates_and_keeps_its_trajectories(tmp_path):
    conn = sqlite3.connect(tmp_path / "s.sqlite")
    conn.executescript(tables.MIGRATIONS[0] + "PRAGMA user_version = 1;")
    conn.execute("INSERT INTO tasks VALUES ('t0', 'synthetic', 'click-button', 0, 'train', '', 0)")
    conn.execute("INSERT INTO trajectories (traj_id, task_id, reward, status, success, source, worker_id,"
                 " temperature, created_at, ingested_at, num_steps, num_screenshots, min_version, max_version)"
                 " VALUES ('old', 't0', 1.0, 'success', 1, 'rollout', 'w9', 0.7, 5.0, 6.0, 0, 0, 0, 0)")
    conn.commit()
    conn.close()
    store = Store(tmp_path / "s.sqlite", tmp_path / "b")
    old = store.load_trajectories(["old"])[0]
    assert (old.worker_id, old.temperature, old.reward, old.steps) == ("w9", 0.7, 1.0, [])
    store.close()


def test_screenshots_are_named_by_hash_and_size_and_old_rows_are_sized_from_their_header(store):
    buf = io.BytesIO()
    Image.new("RGB", (37, 21), (9, 8, 7)).save(buf, "PNG")
    traj = msgspec.structs.replace(make_trajectory("a", "t0", steps=1), screenshots=[buf.getvalue()])
    put(store, traj)
    want = [[ScreenshotRef(sha256=address(buf.getvalue()), height=21, width=37)]]
    assert store.screenshot_refs(["a"]) == want
    assert store.load_trajectories(["a"], screenshots=False)[0].screenshots == []
    with store.write() as w:  # a blob row from before schema 3 recorded sizes
        w.execute("UPDATE blobs SET height = NULL, width = NULL")
    assert store.screenshot_refs(["a"]) == want
