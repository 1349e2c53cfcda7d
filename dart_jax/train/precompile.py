"""Compiling the RL update's programs while the trainer waits for its first batch.

A trainer that starts (or restarts) waits for its first curated batch while the rollout
fleet starts its engines and plays the first episodes; compiling the update takes about as
long (tens of seconds on a CPU, minutes for a large model on a pod). `Precompiler` spends
that wait: a thread compiles what an RL update on each bucket runs (`score`, `zeros`,
`accumulate`, `apply`), smallest bucket first, until the first batch arrives. Each program
is compiled once (`TrainFunctions`): one the batch needs that the thread is still compiling
is waited for, one it has not reached is compiled by the update as before.

    ahead = Precompiler(trainer, collator).start()
    batch = next(source)            # the buckets compiled meanwhile are ready for it
    ahead.stop()                    # the thread ends after the bucket it is on
    ...
    ahead.join()                    # before the process exits
"""

from __future__ import annotations

import itertools
import logging
import threading
import time

import jax
import numpy as np

from dart_jax.train.batch import Bucket, BucketSpec, to_global
from dart_jax.train.collate import Collator
from dart_jax.train.step import RowTargets, Scores, needs_old_logp
from dart_jax.train.trainer import Trainer

log = logging.getLogger(__name__)


def buckets_by_size(spec: BucketSpec) -> list[Bucket]:
    """Every bucket of `spec`, the smallest (tokens, then vision slots) first."""
    pairs = sorted(itertools.product(spec.seq_lens, spec.num_slots))
    return [Bucket(t, s, spec.rows, spec.pack) for t, s in pairs]


def compile_rl_update(trainer: Trainer, collator: Collator, bucket: Bucket) -> None:
    """Compile every program an RL update on a micro-batch of `bucket` runs, running none."""
    fns, params = trainer.fns, trainer.state.params
    mb = to_global(collator.collate_rows([], bucket), fns.mesh)  # all padding: only its shapes count
    scores = Scores(None, None, None)
    if needs_old_logp(trainer.cfg) or trainer.ref_params is not None:
        scores = _shapes(fns.compile_score(params, trainer.ref_params, mb).out_info)
    slots = jax.ShapeDtypeStruct((bucket.rows * bucket.pack * jax.process_count(),), np.float32)
    rows = RowTargets(slots, slots, scores, slots)
    acc = fns.accumulator_shapes(params, mb, rows)
    fns.compile_zeros(params, mb, rows)
    fns.compile_accumulate(params, acc, mb, rows)
    fns.compile_apply(trainer.state, acc)


def _shapes(tree):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


class Precompiler:
    """The module docstring's thread: compiles bucket after bucket until `stop()`, then
    finishes the bucket it is on. `done`: the buckets compiled."""

    def __init__(self, trainer: Trainer, collator: Collator):
        self.trainer, self.collator = trainer, collator
        self.done: list[Bucket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="precompile", daemon=True)

    def start(self) -> "Precompiler":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def join(self) -> None:
        if self._thread.ident is not None:  # started
            self._thread.join()

    def _run(self) -> None:
        start, buckets = time.monotonic(), buckets_by_size(self.collator.buckets)
        for bucket in buckets:
            if self._stop.is_set():
                break
            try:
                compile_rl_update(self.trainer, self.collator, bucket)
            except Exception:  # the update compiles it again and raises there, where it counts
                log.exception("precompiling bucket %s failed", bucket)
                return
            self.done.append(bucket)
        log.info("precompiled %d of %d buckets in %.1f s while waiting for data", len(self.done), len(buckets),
                 time.monotonic() - start)
