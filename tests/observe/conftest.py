"""Fixtures of the tests of dart_jax.observe: the recorded run.

tests/observe/data/run is a run of about 40 seconds recorded with

    PYTHONPATH=$PWD python tests/observe/data/emulate.py tests/observe/data/run

the real data manager (scheduling, ingest, curation, batch records) driven by emulated
rollout workers (2 x 3 episodes, 8 env slots) and an emulated trainer on the wall clock,
each writing what the real role writes (see that script's docstring). Tests get a copy,
since rendering writes under the run directory.
"""

import shutil
from pathlib import Path

import pytest

RECORDED = Path(__file__).parent / "data" / "run"


@pytest.fixture
def recorded(tmp_path) -> Path:
    return Path(shutil.copytree(RECORDED, tmp_path / "run"))
