import pytest

from dart_jax.data.store import Store
from dart_jax.data.testing import task_specs


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "data" / "store.sqlite", tmp_path / "data" / "blobs")
    s.upsert_tasks(task_specs(n_train=10, n_eval=2))
    yield s
    s.close()


def put(store, *trajs):
    """Commit trajectories the way ingestion does (blobs first, then one transaction)."""
    items = [(t, store.put_screenshots(t)) for t in trajs]
    with store.write() as w:
        return [store.insert_trajectory(w, t, d) for t, d in items]
