"""Curated GRPO batches for the trainer, recorded so a resumed trainer gets them again.

`BatchRequest(trainer_version, after_batch_id)`: if batch `after_batch_id + 1` was handed
out before, it is replayed identically from its recorded composition; otherwise a new one
is assembled by `curation.select_groups`, its composition recorded and its own
trajectories marked used in one transaction, then sent. A trainer that crashed after the
record but before receiving the batch simply asks again and gets the replay.

A batch names its screenshots by content (sha256, height, width); the trainer's hosts fetch
the bytes of the rows they build with `ScreenshotRequest`, answered by `serve_screenshots`.
"""

from __future__ import annotations

import threading

from dart_jax.data import curation
from dart_jax.data.config import CurationConfig
from dart_jax.data.scheduler import Scheduler, scheduled_tasks
from dart_jax.data.store import ConflictError, Store
from dart_jax.wire.messages import BatchRequest, CuratedBatch, NoBatch, ScreenshotRequest, Screenshots


class BatchAssembler:
    """`scheduler` given: synchronous mode (a batch is exactly one round of rollouts)."""

    def __init__(self, store: Store, cfg: CurationConfig, scheduler: Scheduler | None = None):
        self.store, self.cfg, self.sync = store, cfg, scheduler
        self._lock = threading.Lock()  # one batch at a time: ids and "used" marks stay exact

    def handle(self, req: BatchRequest) -> CuratedBatch | NoBatch:
        with self._lock:
            last = self.store.last_batch_id()
            if req.after_batch_id < 0 or req.after_batch_id > last:
                raise ConflictError(f"after_batch_id {req.after_batch_id}: batches 1..{last} exist")
            if req.after_batch_id < last:
                return self.replay(req.after_batch_id + 1)
            groups = self.curate(req.trainer_version)
            if isinstance(groups, str):
                return NoBatch(reason=groups, retry_after_s=0.25)
            self.store.record_batch(last + 1, req.trainer_version, groups)
        return self.replay(last + 1)

    def curate(self, trainer_version: int) -> list[curation.Group] | str:
        """The groups of the next batch, or why there is none yet."""
        if self.sync is not None:
            return self.curate_round(trainer_version)
        cfg = self.cfg
        fresh = self.store.fresh_candidates(trainer_version - cfg.max_staleness)
        need = {t: curation.rollout_count(curation.success_rate(
            self.store.recent_outcomes(t, cfg.success_window)), cfg) for t in fresh}
        pool = {t: self._pool(t) for t, recs in fresh.items() if not any(r.success for r in recs)}
        wanted = min(cfg.tasks_per_batch, len(scheduled_tasks(self.store, cfg)))
        if wanted == 0:
            return "no training tasks in this run"
        groups = curation.select_groups(fresh, pool, need, wanted, cfg)
        if groups is None:
            return (f"waiting for data: {wanted} ready tasks needed; {len(fresh)} tasks have fresh "
                    f"rollouts at trainer version {trainer_version}")
        return groups

    def curate_round(self, version: int) -> list[curation.Group] | str:
        """Synchronous mode: every rollout of version `version`'s round, once all are in."""
        tasks = self.sync.round_tasks(version)
        if tasks is None:
            return f"the round of version {version} is still rolling out"
        fresh = self.store.fresh_candidates(version)
        groups = [curation.round_group(t, fresh[t], self._pool(t), self.cfg)
                  for t in dict.fromkeys(tasks) if fresh.get(t)]
        if not groups:
            self.sync.restart_round()
            return f"the round of version {version} gave no trainable rollouts; rolling it again"
        return groups

    def _pool(self, task_id: str):
        """The experience pool's successes of a task (none when the pool is switched off)."""
        return self.store.pool_successes(task_id) if self.cfg.experience_pool else ()

    def replay(self, batch_id: int) -> CuratedBatch:
        recorded = self.store.batch(batch_id)
        if recorded is None:
            raise ConflictError(f"batch {batch_id} is not recorded")
        version, items = recorded
        ids = [t for t, _ in items]
        return CuratedBatch(batch_id=batch_id, trainer_version=version,
                            trajectories=self.store.load_trajectories(ids, screenshots=False),
                            screens=self.store.screenshot_refs(ids), injected=[t for t, inj in items if inj])


def serve_screenshots(store: Store, req: ScreenshotRequest, max_bytes: int) -> Screenshots:
    """The PNGs a trainer asks for by hash, as many as `max_bytes` holds (at least one)."""
    return Screenshots(png=store.read_screenshots(req.sha256, max_bytes))
