"""Compiling the RL update ahead of the first batch (train/precompile.py): what the thread
compiles is exactly what an update runs, and a program both ask for compiles once."""

import jax
import numpy as np
import pytest

from dart_jax.models.sharding import make_mesh
from dart_jax.testing.trajectories import trajectory
from dart_jax.train.batch import Bucket, BucketSpec
from dart_jax.train.config import LossConfig, OptimizerConfig, SelectionConfig, TrainerConfig
from dart_jax.train.precompile import Precompiler, buckets_by_size
from dart_jax.train.trainer import Trainer
from tests.train_batches import collator, layout_inline


@pytest.fixture(scope="module")
def rl(tiny_dir, builder):
    col = collator(tiny_dir, 4, seq_lens=(1024,), num_slots=(1536,))  # one bucket holds every step
    trajs = [trajectory(builder, f"{task}-{i}", task, steps=2, reward=float(i == 0))
             for task in ("t0", "t1") for i in range(2)]
    return col, layout_inline(trajs, col)


def test_the_buckets_go_smallest_first():
    spec = BucketSpec(seq_lens=(1024, 768), num_slots=(1536, 768), rows=4, pack=2)
    assert buckets_by_size(spec) == [Bucket(768, 768, 4, 2), Bucket(768, 1536, 4, 2),
                                     Bucket(1024, 768, 4, 2), Bucket(1024, 1536, 4, 2)]


def test_an_update_while_the_thread_compiles_finds_every_program_compiled_once(tiny_dir, rl):
    """Every term on (old log-probs and entropies for selection, the KL's reference pass):
    the update starts while the thread compiles; after both, each bucket's `score` and
    `accumulate` compiled once, `zeros` and `apply` once in all; the next update compiles
    nothing. A thread stopped before it starts compiles nothing."""
    col, batch = rl
    cfg = TrainerConfig(mode="rl", optimizer=OptimizerConfig(lr=1e-3), loss=LossConfig(kl_coef=0.1),
                        selection=SelectionConfig(enabled=True, fraction=0.5))
    tr = Trainer(cfg, tiny_dir, make_mesh(1, 1, 1))
    ahead = Precompiler(tr, col).start()
    first = jax.device_get(tr.update_rl(batch, col))
    ahead.join()  # not stopped: it compiles every bucket
    n = len(buckets_by_size(col.buckets))
    assert ahead.done == buckets_by_size(col.buckets) and set(batch.buckets) <= set(ahead.done)
    assert {k: tr.fns.compiles[k] for k in ("score", "accumulate", "zeros", "apply")} == {
        "score": n, "accumulate": n, "zeros": 1, "apply": 1}
    before = dict(tr.fns.compiles)
    tr.update_rl(batch, col)
    assert tr.fns.compiles == before
    assert np.isfinite(first["loss/total"]) and first["optim/grad_norm"] > 0
    idle = Precompiler(tr, col)
    idle.stop()
    idle.start().join()
    assert idle.done == []
