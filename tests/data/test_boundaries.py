"""Hostile input to every data-manager request that names a path, an id or a number: each
is refused with a typed error naming the field, nothing outside the run directory changes,
nothing is overwritten, and the service keeps serving."""

import hashlib
import os
from pathlib import Path

import pytest

from dart_jax.data import pool
from dart_jax.testing.trajectories import make_trajectory, put
from dart_jax.wire import RemoteError
from dart_jax.wire.messages import (BatchRequest, ExportTrajectories, Exported, PoolImport, PoolImported,
                                    StatsRequest, SubmitTrajectory, TaskRequest, TrajectoryAck)

ODD_IDS = ["../../x", "/abs/x", "a/b", "x" * 10_000, "", ".hidden", "-rf", "a b", "ok\n", "nul\x00",
           "caf\u00e9", "semi;colon", "$(id)"]
ODD_TASK_IDS = ["../t0", "t0/../t1", "/t0", "t0/", "t0//x", "x" * 300, "t0\n", "t 0", ""]
ODD_PATHS = ["x" * 5000, "ex\x00port.jsonl", "a\nb.jsonl", ""]


@pytest.fixture
def hostile(tmp_path, serve_manager):
    """A run directory beside an `outside` tree the wire must never touch: a victim file, a
    directory of importable successes, and symlinks from the run directory to both."""
    run, outside = tmp_path / "run", tmp_path / "outside"
    client = serve_manager(run)
    (outside / "demos").mkdir(parents=True)
    pool.write_trajectories(outside / "demos" / "d.jsonl", [make_trajectory("od", "t0", success=True)], "jsonl")
    (outside / "victim.jsonl").write_bytes(b"precious\n")
    (run / "link").symlink_to(outside)
    (run / "leaks").mkdir()
    (run / "leaks" / "a.jsonl").symlink_to(outside / "demos" / "d.jsonl")
    (run / "export").mkdir()
    (run / "export" / "earlier.jsonl").write_bytes(b"an earlier export\n")
    return client, run, outside


def snapshot(root: Path) -> dict:
    """Every entry under `root` with its kind and its bytes' hash (links not followed)."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(dirpath) / name
            if p.is_symlink():
                out[p.relative_to(root)] = ("link", os.readlink(p))
            elif p.is_file():
                out[p.relative_to(root)] = ("file", hashlib.sha256(p.read_bytes()).hexdigest())
            else:
                out[p.relative_to(root)] = ("dir", None)
    return out


def refused(client, msg, code: str, *words: str) -> str:
    with pytest.raises(RemoteError) as err:
        client.request(msg)
    assert err.value.code == code, err.value
    for word in words:
        assert word in err.value.message, err.value.message
    return err.value.message


def test_paths_cannot_reach_outside_the_run_directory(hostile):
    client, run, outside = hostile
    before, run_files = snapshot(outside), {p: run.joinpath(p).read_bytes() for p in ("tasks.jsonl",
                                                                                       "export/earlier.jsonl")}
    escapes = ["../outside/victim.jsonl", "export/../../outside/new.jsonl", "..", str(outside / "victim.jsonl"),
               str(outside / "new.jsonl"), "/etc/passwd", "link/victim.jsonl", "link/new.jsonl", "link"]
    for path in escapes:
        for fmt in ("jsonl", "traj"):
            refused(client, ExportTrajectories(path=path, format=fmt), "bad_request", "path:")
        refused(client, PoolImport(path=path), "bad_request", "path:")
    # a symlink inside an importable directory, or named directly, may not lead out either
    refused(client, PoolImport(path="leaks"), "bad_request", "outside")
    refused(client, PoolImport(path="leaks/a.jsonl"), "bad_request", "outside")
    for path in ODD_PATHS:
        refused(client, ExportTrajectories(path=path), "bad_request", "$.path")
        refused(client, PoolImport(path=path), "bad_request", "$.path")
    # export creates only new paths: what is there stays byte for byte
    for path in ("tasks.jsonl", "export/earlier.jsonl", "export", "data/store.sqlite", "."):
        refused(client, ExportTrajectories(path=path), "conflict", "exists")
    assert snapshot(outside) == before
    assert {p: run.joinpath(p).read_bytes() for p in run_files} == run_files
    assert client.request(StatsRequest()).pool == 0  # nothing was imported from outside
    assert not list(run.rglob("*.partial"))  # no temporary left behind


def test_exports_are_new_complete_files_and_round_trip(hostile):
    client, run, _ = hostile
    for i in range(3):
        client.request(SubmitTrajectory(trajectory=make_trajectory(f"s{i}", "t0", success=i != 1)))
    got = client.request(ExportTrajectories(path="export/ok.jsonl", success_only=True))
    assert got == Exported(path=str(run.resolve() / "export" / "ok.jsonl"), count=2)
    first = (run / "export" / "ok.jsonl").read_bytes()
    refused(client, ExportTrajectories(path="export/ok.jsonl"), "conflict", "exists")
    assert (run / "export" / "ok.jsonl").read_bytes() == first
    assert client.request(ExportTrajectories(path="export/all", format="traj")).count == 3
    assert sorted(p.name for p in (run / "export" / "all").iterdir()) == ["s0.traj", "s1.traj", "s2.traj"]
    assert client.request(PoolImport(path="export/ok.jsonl")) == PoolImported(imported=0, duplicates=2, skipped=0)


def test_configured_roots_open_only_what_they_name(tmp_path, serve_manager):
    run, shared = tmp_path / "run", tmp_path / "shared"
    pool.write_trajectories(shared / "demos" / "d.jsonl", [make_trajectory("sd", "t0", success=True)], "jsonl")
    client = serve_manager(run, request_paths={"import_roots": [str(shared / "demos")],
                                               "export_roots": [str(shared / "out")]})
    assert client.request(PoolImport(path=str(shared / "demos"))).imported == 1
    assert client.request(ExportTrajectories(path=str(shared / "out" / "a.jsonl"))).count == 1
    refused(client, ExportTrajectories(path=str(shared / "demos" / "b.jsonl")), "bad_request", "outside")
    refused(client, PoolImport(path=str(shared / "out")), "bad_request", "outside")
    refused(client, PoolImport(path=str(shared)), "bad_request", "outside")


@pytest.mark.parametrize("field, value", [("traj_id", v) for v in ODD_IDS]
                         + [("task_id", v) for v in ODD_TASK_IDS]
                         + [("worker_id", v) for v in ODD_IDS if v])
def test_trajectory_ids_are_checked_at_the_boundary(hostile, field, value):
    client, run, outside = hostile
    traj = make_trajectory("ok-1", "t0")
    setattr(traj, field, value)
    refused(client, SubmitTrajectory(trajectory=traj), "bad_request", f"$.trajectory.{field}")
    assert client.request(SubmitTrajectory(trajectory=make_trajectory("ok-2", "t0"))) == \
        TrajectoryAck(traj_id="ok-2", duplicate=False)
    assert client.request(StatsRequest()).trajectories == 1


def test_ids_and_numbers_of_the_other_requests(hostile):
    client, _, _ = hostile
    for value in ODD_IDS:
        refused(client, TaskRequest(worker_id=value, policy_version=0), "bad_request", "$.worker_id")
    for value in ODD_TASK_IDS:
        refused(client, StatsRequest(task_ids=["t0", value]), "bad_request", "$.task_ids[1]")
    for version in (-2, 2**63):
        refused(client, TaskRequest(worker_id="w0", policy_version=version), "bad_request", "$.policy_version")
        refused(client, BatchRequest(trainer_version=version, after_batch_id=0), "bad_request",
                "$.trainer_version")
    refused(client, BatchRequest(trainer_version=0, after_batch_id=-1), "bad_request", "$.after_batch_id")
    traj = make_trajectory("v", "t0")
    traj.steps[1].policy_version = 2**63
    refused(client, SubmitTrajectory(trajectory=traj), "bad_request", "$.trajectory.steps[1].policy_version")
    # what the system generates itself passes: uuid hex, host:pid:suffix, backend/name/seed
    assert client.request(TaskRequest(worker_id="gpu-node-7.example.org:4242:ab12cd", policy_version=-1))
    assert client.request(SubmitTrajectory(trajectory=make_trajectory("0f" * 16, "t0"))).traj_id == "0f" * 16


def test_export_refuses_a_stored_id_that_would_name_a_path(store, tmp_path):
    """A store from before ids were checked (schema 1: no head record) may hold one: export
    refuses it and writes nothing."""
    put(store, make_trajectory("../../evil", "t0"))
    with store.write() as w:
        w.execute("UPDATE trajectories SET head = NULL")
    with pytest.raises(ValueError, match="cannot be a file name"):
        pool.export(store, tmp_path / "out", "traj")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]
