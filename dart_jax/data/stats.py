"""Statistics for dashboards: per-task success, attempts, lengths, versions, curation state."""

from __future__ import annotations

from typing import Sequence

from dart_jax.data import curation
from dart_jax.data.config import CurationConfig
from dart_jax.data.store import Store
from dart_jax.wire.messages import DataStats, TaskStats

_PER_TASK = """
SELECT k.task_id, k.split,
       count(t.seq) FILTER (WHERE t.source = 'rollout' AND t.status != 'env_error'),
       count(t.seq) FILTER (WHERE t.source = 'rollout' AND t.success = 1),
       count(t.seq) FILTER (WHERE t.source = 'rollout' AND t.status = 'env_error'),
       coalesce(avg(t.num_steps) FILTER (WHERE t.source = 'rollout' AND t.status != 'env_error'), 0),
       coalesce(avg(t.num_steps) FILTER (WHERE t.success = 1), 0),
       coalesce(min(t.min_version) FILTER (WHERE t.source = 'rollout'), -1),
       coalesce(max(t.max_version) FILTER (WHERE t.source = 'rollout'), -1),
       count(t.seq) FILTER (WHERE t.source = 'rollout' AND t.used_batch IS NULL
                            AND t.status != 'env_error'),
       (SELECT count(*) FROM pool p WHERE p.task_id = k.task_id)
FROM tasks k LEFT JOIN trajectories t USING (task_id)
GROUP BY k.task_id ORDER BY k.rowid
"""


def collect(store: Store, cfg: CurationConfig, task_ids: Sequence[str] = ()) -> DataStats:
    wanted = set(task_ids)
    tasks = []
    for row in store.query(_PER_TASK):
        if wanted and row[0] not in wanted:
            continue
        recent = curation.success_rate(store.recent_outcomes(row[0], cfg.success_window))
        lengths = store.success_lengths(row[0], cfg.length_window)
        tasks.append(TaskStats(
            task_id=row[0], split=row[1], attempts=row[2], successes=row[3], env_errors=row[4],
            success_rate=row[3] / row[2] if row[2] else 0.0, recent_success_rate=recent,
            rollouts=curation.rollout_count(recent, cfg), max_steps=curation.max_steps(lengths, cfg),
            mean_steps=row[5], mean_success_steps=row[6], min_version=row[7], max_version=row[8],
            unused=row[9], pool=row[10]))
    (n_traj, n_steps, n_batches, n_pool), = store.query(
        "SELECT (SELECT count(*) FROM trajectories), (SELECT count(*) FROM steps),"
        " (SELECT count(*) FROM batches), (SELECT count(*) FROM pool)")
    return DataStats(tasks=tasks, trajectories=n_traj, steps=n_steps, batches=n_batches,
                     pool=n_pool, latest_version=store.latest_version())
