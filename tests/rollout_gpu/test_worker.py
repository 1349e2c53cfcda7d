"""A real rollout worker (`dart-jax rollout`, vLLM CPU) against a real data manager, env
server and weight publisher: exact tokens, per-worker weight sync, and its faults.

One worker process for the module (engine start about 30 s); the tests run in file order
and each takes the system as the previous one left it (a worker serving the newest good
version). The tiny policy has init 0.1, so logits are O(1-10) and a weight change moves
the log-probs far beyond the parity bound.
"""

import dataclasses
import json
import os
import threading
import time

import jax
import numpy as np
import pytest
from flax import nnx

from dart_jax.run.schema import RunConfig
from dart_jax.config import apply_overrides, from_dict, to_dict
from dart_jax.models import hf_io
from dart_jax.models.tiny import make_tiny_hf_dir
from dart_jax.run.launchers.shm_ledger import mapped_segments
from dart_jax.wire.process_groups import group_pids
from dart_jax.testing.local_stack import LocalStack
from dart_jax.train.batch import BucketSpec
from dart_jax.train.collate import Collator
from dart_jax.train.config import TrainerConfig
from dart_jax.train.rescore import rescore
from dart_jax.wire import from_bytes
from dart_jax.wire.messages import TaskSpec, Trajectory, WeightBucket, WeightPull
from envs.config import Latency, SyntheticSlots
from tests.stores import content_duplicates

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

PARITY_MEAN = 1e-5  # the target for the mean gap (vLLM vs the trainer, fp32)
PARITY_MAX = 1e-4
OVERRIDES = [
    "rollout.episodes=4", "rollout.sampling.max_tokens=24", "rollout.engine.max_model_len=4096",
    "rollout.heartbeat_s=1", "data.curation.min_steps=1", "data.curation.default_max_steps=8",
    "data.curation.max_steps=8", "data.curation.worker_timeout_s=5", "weights.bucket_mb=1",
    "weights.serve.timeout_s=5", "weights.reannounce_s=0.5", "data.curation.max_pending_per_task=100000", "data.curation.max_staleness=0",
]


def _config() -> RunConfig:
    """Env steps of 0.3 s keep the worker's four episodes in flight at every moment (weights
    change under running episodes) while it mostly waits, leaving the CPU to the test."""
    cfg = from_dict(RunConfig, apply_overrides(to_dict(RunConfig()), OVERRIDES, "test"), "test")
    slots = (SyntheticSlots(count=4, step_latency=Latency(kind="fixed", median_s=0.3)),)
    return dataclasses.replace(cfg, envs=dataclasses.replace(cfg.envs, slots=slots))


@pytest.fixture(scope="module")
def system(tmp_path_factory):
    root = tmp_path_factory.mktemp("rollout")
    hf_dir = make_tiny_hf_dir(root / "policy", init_std=0.1)
    tasks = [TaskSpec(task_id=f"synthetic/click-button/{i}", backend="synthetic", name="click-button", seed=i)
             for i in range(4)]
    with LocalStack(root / "run", hf_dir, tasks, _config()) as stack:
        stack.start_worker("w0")
        model, _ = hf_io.load_model(hf_dir)
        stack.graphdef, stack.params = nnx.split(model)
        # one bucket: one compilation of the scoring step for the whole module
        stack.collator = Collator.from_pretrained(hf_dir, BucketSpec((2048,), (4096,), 4))
        yield stack


def steps_at(stack, version: int, after: float = 0.0, limit: int = 8):
    """Up to `limit` trajectories created after `after` whose steps all come from `version`."""
    ids = stack.data.store.query(
        "SELECT traj_id FROM trajectories WHERE min_version = ?1 AND max_version = ?1 AND num_steps > 0"
        " AND created_at > ?2 ORDER BY seq LIMIT ?3", (version, after, limit))
    return stack.data.store.load_trajectories([i for (i,) in ids])


def steps_between(stack, old: int, new: int):
    """Trajectories whose steps come from version `old`, then `new`."""
    ids = stack.data.store.query("SELECT traj_id FROM trajectories WHERE min_version = ? AND max_version = ?",
                                 (old, new))
    return stack.data.store.load_trajectories([i for (i,) in ids])


def count_at(stack, version: int, after: float = 0.0) -> int:
    return stack.data.store.query("SELECT count(*) FROM trajectories WHERE min_version = ?1 AND max_version = ?1"
                                  " AND num_steps > 0 AND created_at > ?2", (version, after))[0][0]


def gaps(stack, params, trajs):
    scores = rescore((stack.graphdef, params), trajs, stack.collator, TrainerConfig())
    assert scores, "no step fits the buckets"
    d = np.concatenate([np.abs(s.policy_logp_R.astype(np.float64) - s.sampled_logp_R) for s in scores])
    return float(d.mean()), float(d.max())


def perturbed(params, seed: int):
    keys = iter(jax.random.split(jax.random.key(seed), len(jax.tree.leaves(params))))
    return jax.tree.map(lambda x: x * (1 + 0.1 * jax.random.normal(next(keys), x.shape, x.dtype)), params)


def worker_syncs(stack, worker_id="w0"):
    path = stack.run.metrics_path(f"rollout-{worker_id}")
    return [r for r in map(json.loads, path.read_text().splitlines()) if "sync_version" in r] if path.exists() else []


def test_worker_samples_the_policys_exact_tokens(system):
    system.wait(lambda s: s.trajectories >= 6, 300, "6 trajectories")
    trajs = steps_at(system, 0)
    builder_ok = all(len(s.prompt_ids) > 0 and len(s.response_ids) == len(s.logprobs) for t in trajs for s in t.steps)
    assert builder_ok and all(t.assignment_id and t.env_slot for t in trajs)
    mean, worst = gaps(system, system.params, trajs)
    assert mean <= PARITY_MEAN and worst <= PARITY_MAX, (mean, worst)
    for t in trajs:  # wall-clock stamps in order on every step
        for s in t.steps:
            assert s.gen_s[0] <= s.gen_s[1] <= s.env_s[0] <= s.env_s[1]


def test_weight_sync_moves_the_worker_to_the_new_policy(system):
    new = perturbed(system.params, 1)
    old_vs_new = gaps(system, new, steps_at(system, 0)[:4])[0]
    assert old_vs_new > 100 * PARITY_MEAN  # the change is visible far above the parity bound
    published = time.time()
    version = system.publish(new)
    system.wait(lambda s: count_at(system, version, published) >= 4, 300, f"trajectories at version {version}")
    fresh = steps_at(system, version, published)
    mean, worst = gaps(system, new, fresh)
    assert mean <= PARITY_MEAN and worst <= PARITY_MAX, (mean, worst)
    assert gaps(system, system.params, fresh)[0] > 100 * PARITY_MEAN  # no longer the old policy
    sync = worker_syncs(system)[-1]
    assert sync["sync_ok"] and sync["sync_version"] == version
    system.params = new


def test_episodes_in_flight_during_a_sync_finish_normally(system):
    """Syncs land at random points of the worker's episodes: republish (the same weights,
    new versions) until one lands mid-episode, then check the episodes it cut across."""
    for _ in range(6):
        version = system.publish(system.params)
        system.wait(lambda s: count_at(system, version) >= 4, 300, f"trajectories at version {version}")
        spanning = [t for t in steps_between(system, version - 1, version) if t.steps]
        if spanning:
            break
    assert spanning, "no sync landed inside an episode in 6 tries"
    for t in spanning:
        assert t.status != "env_error"
        versions = [s.policy_version for s in t.steps]
        assert versions == sorted(versions)  # old version, then the new one
        # `pause: keep` (the default): a step the update cut is kept, marked, under the version it was submitted to
        assert all(s.policy_version == version - 1 for s in t.steps if s.straddles_update)
    assert gaps(system, system.params, spanning)[0] <= PARITY_MEAN  # same weights: every step matches


def test_a_corrupt_bucket_leaves_the_worker_on_its_version(system):
    good = system.publisher.version
    serve = system.publisher.server.handler

    def corrupt(msg):
        reply = serve(msg)
        if isinstance(msg, WeightPull) and msg.version == good + 1 and msg.bucket == 1:
            data = np.array(reply.pieces[0])
            data[len(data) // 2] ^= 0xFF
            reply = WeightBucket(version=reply.version, bucket=reply.bucket, checksum=reply.checksum,
                                 pieces=[data, *reply.pieces[1:]])
        return reply

    system.publisher.server.handler = corrupt
    try:  # every pull of the new version stays corrupt until the worker has shown it kept the old
        system.publish(perturbed(system.params, 2))
        deadline = time.monotonic() + 120
        while not any(r["sync_version"] == good + 1 for r in worker_syncs(system)):
            assert time.monotonic() < deadline, "the worker never tried the corrupt version"
            time.sleep(0.5)
        failed = [r for r in worker_syncs(system) if r["sync_version"] == good + 1]
        assert not failed[0]["sync_ok"] and "checksum mismatch" in failed[0]["sync_error"]
        after = time.time()
        system.wait(lambda s: count_at(system, good, after) >= 2, 120, "trajectories at the old version")
    finally:
        system.publisher.server.handler = serve
    mean, _ = gaps(system, system.params, steps_at(system, good, after))
    assert mean <= PARITY_MEAN


def test_a_publisher_killed_mid_transfer_leaves_the_worker_on_its_version(system):
    good = system.publisher.version
    publisher = system.publisher
    serve = publisher.server.handler
    dead = threading.Event()

    def dies_after_first_bucket(msg):
        if isinstance(msg, WeightPull) and msg.bucket >= 1:
            dead.wait()  # nothing answers any more, as when the trainer's process is gone
        return serve(msg)

    publisher.server.handler = dies_after_first_bucket
    try:
        assert len(system.publisher._versions) and system.publish(perturbed(system.params, 3)) == good + 1
        assert len(system.publisher._versions[good + 1].announce.buckets) >= 2, "the version needs several buckets"
        deadline = time.monotonic() + 120
        while not any(r["sync_version"] == good + 1 for r in worker_syncs(system)):
            assert time.monotonic() < deadline, "the worker never tried the version"
            time.sleep(0.5)
    finally:
        dead.set()
    failed = [r for r in worker_syncs(system) if r["sync_version"] == good + 1][0]
    assert not failed["sync_ok"] and "WireTimeout" in failed["sync_error"]
    # the trainer comes back and publishes again: the worker catches up
    newest = perturbed(system.params, 4)
    system.restart_publisher()
    published = time.time()
    version = system.publish(newest)
    assert version == good + 2
    system.wait(lambda s: count_at(system, version, published) >= 2, 300, f"trajectories at {version}")
    assert gaps(system, newest, steps_at(system, version, published))[0] <= PARITY_MEAN
    system.params = newest


def test_a_killed_worker_loses_nothing_acknowledged_and_its_assignments_return(system):
    sched = system.data.scheduler
    system.wait(lambda s: s.trajectories >= 1, 60)
    time.sleep(2)  # mid-episode: four episodes are always in flight
    before = {a.id: a for a in sched._assignments.values() if a.worker_id == "w0"}
    assert before, "the worker holds assignments"
    held = mapped_segments(group_pids(system.workers["w0"].pid))  # its vLLM engine's ring buffers
    system.kill_worker("w0")
    assert held and not [p for p in held if os.path.exists(p)], "a SIGKILL leaves no shared memory behind"
    acked = [json.loads(line)["traj"] for line in
             system.run.metrics_path("rollout-w0").read_text().splitlines() if '"traj"' in line]
    assert set(acked) <= {t.traj_id for t in system.trajectories()}
    assert content_duplicates(system.run.data / "store.sqlite") == []
    # the restarted worker (a new session) gets its work again and the newest weights
    newest = system.publisher.version
    restarted = time.time()
    system.start_worker("w0")
    system.wait(lambda s: count_at(system, newest, restarted) >= 2, 300, "the restarted worker's trajectories")
    assert not set(before) & set(sched._assignments), "the killed session's assignments are void"
    # their tasks are handed out again: rollouts of them from new assignments arrive
    killed = {a.task_id for a in before.values()}

    def redone(_) -> bool:
        rows = system.data.store.query("SELECT head FROM trajectories WHERE created_at > ?", (restarted,))
        heads = [from_bytes(h, Trajectory) for (h,) in rows]
        return any(h.task_id in killed and h.assignment_id not in before for h in heads)
    system.wait(redone, 300, "rollouts of the killed assignments' tasks")
