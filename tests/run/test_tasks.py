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


def test_suites_are_interleaved_in_proportion_so_a_short_run_trains_on_each():
    job = from_dict(JobConfig, {"suites": [
        {"backend": "synthetic", "names": ["enter-text", "click-button"], "train_seeds": 4, "eval_seeds": 1},
        {"backend": "miniwob", "names": ["click-test"], "train_seeds": 2, "eval_seeds": 1}]})
    order = [(s.name, s.seed) for s in job.tasks()]
    assert order == [("enter-text", 0), ("click-button", 0), ("click-test", 0), ("enter-text", 1),
                     ("click-button", 1), ("enter-text", 2), ("click-button", 2), ("click-test", 1),
                     ("enter-text", 3), ("click-button", 3),
                     ("enter-text", 10_000), ("click-button", 10_000), ("click-test", 10_000)]
    assert [s.split for s in job.tasks()] == ["train"] * 10 + ["eval"] * 3


def test_a_suite_setting_that_is_not_an_integer_is_refused():
    with pytest.raises(ConfigError, match=r"suites\[0\].config.words: expected int"):
        from_dict(JobConfig, {"suites": [{"backend": "synthetic", "names": ["enter-text"],
                                          "config": {"words": "many"}}]})
