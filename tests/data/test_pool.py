"""Experience pool import (directory of *.traj, JSONL) and export for SFT and analysis."""

import numpy as np
import pytest

from dart_jax.data import pool
from dart_jax.testing.trajectories import make_trajectory, put
from dart_jax.wire import to_bytes


def demos():
    return [make_trajectory("d0", "t0", success=True, source="demo"),
            make_trajectory("d1", "t1", success=True, steps=5),          # an earlier run's rollout
            make_trajectory("d2", "t2", success=False, source="demo"),   # not a success: skipped
            make_trajectory("d3", "zz", success=True, source="demo")]    # unknown task: skipped


@pytest.mark.parametrize("fmt, name", [("traj", "demos"), ("jsonl", "demos.jsonl")])
def test_import_is_idempotent_and_keeps_successes_of_known_tasks(store, tmp_path, fmt, name):
    pool.write_trajectories(tmp_path / name, demos(), fmt)
    got = pool.import_pool(store, tmp_path / name)
    assert (got.imported, got.duplicates, got.skipped) == (2, 0, 2)
    again = pool.import_pool(store, tmp_path / name)
    assert (again.imported, again.duplicates, again.skipped) == (0, 2, 2)
    assert store.query("SELECT traj_id, origin FROM pool ORDER BY traj_id") == [("d0", "import"), ("d1", "import")]
    # an imported rollout is marked as pool data, so it is never taken for a fresh group
    assert store.query("SELECT source FROM trajectories WHERE traj_id = 'd1'") == [("pool",)]
    assert store.fresh_candidates(min_version=0) == {}


@pytest.mark.parametrize("fmt, name", [("traj", "out"), ("jsonl", "out.jsonl")])
def test_export_round_trips_exactly(store, tmp_path, fmt, name):
    trajs = [make_trajectory(f"x{i}", "t0", success=i % 2 == 0, steps=3) for i in range(4)]
    put(store, *trajs)
    assert pool.export(store, tmp_path / name, fmt, success_only=True) == 2
    back = list(pool.read_trajectories(tmp_path / name))
    assert [to_bytes(t) for t in back] == [to_bytes(t) for t in trajs[::2]]
    assert pool.export(store, tmp_path / "eval", fmt, split="eval") == 0


def test_jsonl_is_readable_and_checked(tmp_path):
    path = tmp_path / "a.jsonl"
    pool.write_trajectories(path, [make_trajectory("x", "t0", steps=1)], "jsonl")
    line = path.read_text()
    assert '"response_text":"Thought: step 0' in line and '"dtype":"<i4"' in line
    path.write_text(line.replace('"<i4"', '"|O"'))
    with pytest.raises(ValueError, match=r"a.jsonl:1: not a trajectory.*not allowed"):
        list(pool.read_trajectories(path))


def test_jsonl_arrays_survive(tmp_path):
    t = make_trajectory("x", "t0", steps=2)
    pool.write_trajectories(tmp_path / "a.jsonl", [t], "jsonl")
    (back,) = pool.read_trajectories(tmp_path / "a.jsonl")
    np.testing.assert_array_equal(back.steps[1].logprobs, t.steps[1].logprobs)
