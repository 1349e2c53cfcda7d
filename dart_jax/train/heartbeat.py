"""The trainer's heartbeats to the data manager (process 0 only): how `dart-jax run` watches a
trainer it did not start as a child, such as the hosts of a TPU slice.

    with Heartbeat(cfg.data.wire, period_s, lambda: (trainer.step, trainer.version.value)) as beat:
        ...                                  # train
        beat.finish()                        # the last beat says "finished"; an exception: "failed"

A thread beats every `period_s` (a step of minutes does not silence it); a beat the data
manager does not answer is skipped (the next one tries again), so the trainer never waits on it.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable

from dart_jax.wire import Client, RemoteError, WireConfig, WireTimeout
from dart_jax.wire.messages import TrainerHeartbeat

log = logging.getLogger(__name__)


class Heartbeat:
    def __init__(self, wire: WireConfig, period_s: float, progress: Callable[[], tuple[int, int]]):
        self.wire = dataclasses.replace(wire, timeout_s=min(wire.timeout_s, period_s))
        self.period_s, self.progress = period_s, progress
        self.state = "running"
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="trainer-heartbeat", daemon=True)

    def __enter__(self) -> "Heartbeat":
        self.thread.start()
        return self

    def finish(self) -> None:
        self.state = "finished"

    def __exit__(self, exc_type, *_) -> None:
        if exc_type is not None:
            self.state = "failed"
        self.stop.set()
        self.thread.join()

    def _run(self) -> None:
        with Client(self.wire) as client:
            while True:
                self._beat(client)
                if self.stop.wait(self.period_s):
                    self._beat(client)  # the state it ended in
                    return

    def _beat(self, client: Client) -> None:
        step, version = self.progress()
        try:
            client.request(TrainerHeartbeat(step=step, policy_version=version, state=self.state))
        except (WireTimeout, RemoteError) as e:
            log.warning("trainer heartbeat not answered: %s", e)
