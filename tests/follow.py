"""A rollout worker's side of weight sync for tests that run a trainer: every announced
version pulled and reassembled, with the bytes each trainer host sent (shared by the
two-process pod test and the pod rehearsal)."""

import asyncio
import threading

import numpy as np

from dart_jax.wire import Client, RemoteError, WireConfig, WireTimeout
from dart_jax.wire.config import WeightSyncConfig
from dart_jax.wire.messages import Ping, WeightAnnounce
from dart_jax.wire.pubsub import Subscriber
from dart_jax.wire.weights import WeightTransferError
from rollout_gpu.pull import Puller


class Follower:
    """A rollout worker's side of weight sync: every announced version pulled from its hosts
    and reassembled; per version, the bytes each host sent, counted here and by the host."""

    def __init__(self, weights: WeightSyncConfig):
        self.weights, self.versions, self.sent, self.stop = weights, {}, {}, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.run(self._follow())

    async def _follow(self) -> None:
        sub = Subscriber(self.weights.announce)
        while not self.stop.is_set():
            ann = await sub.receive(timeout_s=0.2)
            if isinstance(ann, WeightAnnounce) and ann.version not in self.versions:
                try:
                    before = [_served(h) for h in ann.hosts]
                    with Puller(ann, self.weights.serve, timeout_s=60) as pull:
                        tensors = {info.name: np.array(data).view(np.float32) for info, data in pull}
                    served = [_served(h) - b for h, b in zip(ann.hosts, before)]
                except (WireTimeout, RemoteError, WeightTransferError):  # the trainer finished meanwhile
                    continue
                shares = [sum(b.nbytes for b in ann.buckets if b.host == h) for h in range(len(ann.hosts))]
                self.versions[ann.version], self.sent[ann.version] = tensors, (shares, served, ann.total_bytes)
        sub.close()


def _served(endpoint: str) -> int:
    """The bytes a trainer host's bucket server has sent (its own count)."""
    with Client(WireConfig(endpoint=endpoint, timeout_s=5)) as client:
        return int(client.request(Ping()).info["bytes_served"])
