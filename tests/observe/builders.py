"""Tiny hand-built records for the tests of dart_jax.observe."""

from dart_jax.observe.records import BatchRecord, StepTiming, TrainerRound, TrajectoryTiming


def traj(slot="e#0", worker="w0", reset=(0.0, 0.0), steps=(), evaluate=(0.0, 0.0), source="rollout",
         task="t0", split="train", status="failure", created=0.0) -> TrajectoryTiming:
    """steps: (gen_s, env_s) pairs."""
    return TrajectoryTiming(seq=0, traj_id=f"{slot}/{reset}", task_id=task, split=split, status=status,
                            reward=float(status == "success"), source=source, worker_id=worker,
                            created_at=created, ingested_at=created, env_slot=slot, reset_s=reset,
                            evaluate_s=evaluate, weight_loads=(),
                            steps=tuple(StepTiming(gen_s=g, env_s=e, policy_version=0) for g, e in steps))


def rnd(batch_id, fetch, update, publish, end, version=1) -> TrainerRound:
    return TrainerRound(step=batch_id, policy_version=version, batch_id=batch_id, fetch_start=fetch,
                        update_start=update, publish_start=publish, publish_end=end)


def batch(batch_id, steps, staleness=()) -> BatchRecord:
    return BatchRecord(batch_id=batch_id, trainer_version=0, created_at=0.0, trajectories=1, steps=steps,
                       staleness=tuple(staleness))
