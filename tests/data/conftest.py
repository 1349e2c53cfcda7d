import pytest

from dart_jax.data.store import Store
from dart_jax.data.testing import task_specs


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "data" / "store.sqlite", tmp_path / "data" / "blobs")
    s.upsert_tasks(task_specs(n_train=10, n_eval=2))
    yield s
    s.close()

