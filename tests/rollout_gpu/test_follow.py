"""The worker's weight follower against a real PUB socket: after a slow pull it takes the
newest version announced meanwhile, not the next one in line (which the trainer may have
stopped serving), and a load that breaks the engine ends the worker."""

import asyncio

import pytest

from dart_jax.wire import WireConfig
from dart_jax.wire.config import WeightSyncConfig
from dart_jax.wire.messages import WeightAnnounce
from dart_jax.wire.pubsub import Publisher
from rollout_gpu.config import RolloutConfig
from rollout_gpu.engine import EngineBroken, SyncEvent
from rollout_gpu.worker import Worker


class SlowEngine:
    """An engine whose first update takes until `release` is set."""

    def __init__(self, broken_at: int | None = None):
        self.version, self.calls, self.broken_at = 0, [], broken_at
        self.pulling, self.release = asyncio.Event(), asyncio.Event()

    async def update(self, ann, weights):
        self.calls.append(ann.version)
        if ann.version == self.broken_at:
            raise EngineBroken("half loaded")
        if len(self.calls) == 1:
            self.pulling.set()
            await self.release.wait()
        self.version = ann.version
        return SyncEvent(ann.version, 0.0, 0.0, 0.0, ok=True)


def _ann(version: int) -> WeightAnnounce:
    return WeightAnnounce(version=version, hosts=["tcp://127.0.0.1:1"], tensors=[], buckets=[], total_bytes=0,
                          published_at=0.0)


def _worker(tmp_path, engine) -> tuple[Worker, Publisher]:
    pub = Publisher(WireConfig(endpoint=f"ipc://{tmp_path}/announce"))
    weights = WeightSyncConfig(announce=WireConfig(endpoint=pub.endpoint))
    return Worker(RolloutConfig(), engine, None, WireConfig(endpoint=f"ipc://{tmp_path}/dm"), (), weights), pub


async def _close(worker: Worker, pub: Publisher) -> None:
    await worker.envs.aclose()
    await worker.dm.aclose()
    pub.close()


async def _until(cond, pub: Publisher | None = None, ann=None, timeout_s: float = 10.0) -> None:
    for _ in range(int(timeout_s / 0.05)):
        if cond():
            return
        if pub is not None:
            pub.send(ann)  # PUB drops what a late subscriber missed: repeat, as the publisher does
        await asyncio.sleep(0.05)
    raise AssertionError("timed out")


def test_after_a_slow_pull_the_newest_announced_version_is_taken(tmp_path):
    async def scenario():
        engine = SlowEngine()
        worker, pub = _worker(tmp_path, engine)
        follower = asyncio.create_task(worker.follow_weights())
        try:
            await _until(engine.pulling.is_set, pub, _ann(1))
            for v in (2, 3, 4):  # announced while version 1 is still being pulled
                pub.send(_ann(v))
            await asyncio.sleep(0.3)
            engine.release.set()
            await _until(lambda: engine.version == 4)
            await asyncio.sleep(0.3)
        finally:
            follower.cancel()
            await asyncio.gather(follower, return_exceptions=True)
            await _close(worker, pub)
        return engine, worker

    engine, worker = asyncio.run(scenario())
    assert engine.calls == [1, 4]
    assert [s.version for s in worker.syncs] == [1, 4]


def test_a_load_that_breaks_the_engine_ends_the_follower(tmp_path):
    async def scenario():
        engine = SlowEngine(broken_at=1)
        worker, pub = _worker(tmp_path, engine)
        follower = asyncio.create_task(worker.follow_weights())
        try:
            await _until(follower.done, pub, _ann(1))
        finally:
            await _close(worker, pub)
        return follower, worker

    follower, worker = asyncio.run(scenario())
    with pytest.raises(EngineBroken):
        follower.result()
    (sync,) = worker.syncs
    assert not sync.ok and "engine broken: half loaded" in sync.error
