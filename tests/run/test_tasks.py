"""A run's task suites: disjoint train and eval seeds, the suite's settings on every task."""

import json

import pytest

from dart_jax.config.loader import ConfigError, from_dict
from dart_jax.run.tasks import JobConfig
from envs.types import Task


def test_a_suites_config_reaches_every_task_and_the_env_reads_it():
    job = from_dict(JobConfig, {"suites": [{"backend": "synthetic", "names": ["enter-text"], "train_seeds": 3,
                                            "eval_seeds": 2, "config": {"words": 4, "difficulty": 2}}]})
    specs = job.tasks()
    assert [(s.seed, s.split) for s in specs] == [(0, "train"), (1, "train"), (2, "train"),
                                                   (10_000, "eval"), (10_001, "eval")]
    assert {json.loads(s.config)["words"] for s in specs} == {4}
    assert Task.from_spec(specs[0]).config == {"difficulty": 2, "words": 4}
    plain = from_dict(JobConfig, {"suites": [{"backend": "synthetic", "names": ["enter-text"]}]})
    assert {s.config for s in plain.tasks()} == {""}


def test_a_suite_setting_that_is_not_an_integer_is_refused():
    with pytest.raises(ConfigError, match=r"suites\[0\].config.words: expected int"):
        from_dict(JobConfig, {"suites": [{"backend": "synthetic", "names": ["enter-text"],
                                          "config": {"words": "many"}}]})
