import pytest

from dart_jax.agent.config import PromptConfig
from dart_jax.agent.prompt import PromptBuilder
from dart_jax.testing.trajectories import trajectory
from dart_jax.wire.trajfiles import write_trajectories


@pytest.fixture(scope="session")
def builder(tiny_dir):
    """Two screenshots a prompt keeps the tests' sequences short; the window logic is the same."""
    return PromptBuilder.from_pretrained(tiny_dir, PromptConfig(max_images=2))


@pytest.fixture(scope="session")
def trajs(builder):
    """Three successes (two tasks) and a failure, sorted by id as a *.traj directory lists them."""
    out = [trajectory(builder, "a", "t0", steps=3), trajectory(builder, "b", "t1", steps=2),
           trajectory(builder, "c", "t0", steps=2), trajectory(builder, "d", "t1", steps=2, reward=0.0)]
    return out


@pytest.fixture(scope="session")
def files(trajs, tmp_path_factory):
    root = tmp_path_factory.mktemp("trajs")
    write_trajectories(root / "dir", trajs, "traj")
    write_trajectories(root / "all.jsonl", trajs, "jsonl")
    return root / "dir", root / "all.jsonl"
