import pytest

from tests.models import hf_reference


@pytest.fixture(scope="session")
def hf_models(tmp_path_factory):
    """name -> (checkpoint dir, torch model) for every tiny reference config, built once."""
    pytest.importorskip("transformers")
    out = {}
    for name in hf_reference.CONFIGS:
        path = tmp_path_factory.mktemp(f"hf_{name}")
        out[name] = (path, hf_reference.build(name, path))
    return out
