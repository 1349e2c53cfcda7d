import pytest

from dart_jax.agent.prompt import PromptBuilder, PromptConfig
from dart_jax.models.tiny import make_tiny_hf_dir


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    return make_tiny_hf_dir(tmp_path_factory.mktemp("tiny_hf"))


@pytest.fixture(scope="session")
def builder(tiny_dir):
    """Two screenshots a prompt keeps the tests' sequences short; the window logic is the same."""
    return PromptBuilder.from_pretrained(tiny_dir, PromptConfig(max_images=2))
