"""The weight publisher: the trainer side of weight sync, and the owner of the policy version.

    publisher = WeightPublisher(cfg.weights, model_config, state_file=run.root / "weights.json")
    version = publisher.publish(trainer.state.params)   # version = number of publishes

Each publish converts the parameters with the function the Hugging Face export uses
(`convert.hf_buckets`: HF names, torch layout, the rollout engine's dtype), packs them into
CRC-guarded buckets, serves them (WeightPull -> WeightBucket, WeightLatest -> the newest
WeightAnnounce) and announces the version on PUB, repeating the newest announcement every
`reannounce_s` so late subscribers and workers that were down catch up. The newest
`keep_versions` versions are served, so a worker in the middle of a pull finishes it.

Versions only grow, across restarts too: `state_file` records the last one published, and
a resumed trainer publishes its restored weights under a new number (workers may hold a
version published after the checkpoint it resumed from).

Multi-host: every process runs `publish` (the conversion gathers each sharded tensor with
a collective, one tensor at a time, so no host holds more than one bucket beyond its own
shards); only process 0 packs, serves and announces. Cost: each parameter crosses the
network once per publish, to process 0, plus the workers' pulls from process 0.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import OrderedDict
from pathlib import Path

import jax
import ml_dtypes
import numpy as np

from dart_jax.models.config import Qwen25VLConfig
from dart_jax.models.convert import hf_buckets
from dart_jax.wire import Server
from dart_jax.wire.messages import (Error, Message, WeightAnnounce, WeightBucket, WeightLatest,
                                    WeightPull)
from dart_jax.wire.pubsub import Publisher
from dart_jax.wire.weights import WeightSyncConfig, pack_bucket

log = logging.getLogger(__name__)
_NUMPY = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16),
          "bfloat16": np.dtype(ml_dtypes.bfloat16)}


class WeightPublisher:
    def __init__(self, cfg: WeightSyncConfig, model_config: Qwen25VLConfig, *,
                 state_file: Path | None = None, serve: bool | None = None):
        self.cfg, self.model_config, self.state_file = cfg, model_config, state_file
        self.serving = jax.process_index() == 0 if serve is None else serve
        self.version = _read_version(state_file) if self.serving else 0
        if jax.process_count() > 1:  # process 0's record holds (other hosts may not see the file)
            from jax.experimental import multihost_utils
            self.version = int(multihost_utils.broadcast_one_to_all(np.int64(self.version)))
        self._versions: OrderedDict[int, tuple[WeightAnnounce, list[np.ndarray]]] = OrderedDict()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.server = self.pub = None
        if self.serving:
            self.server = Server(cfg.serve, self.handle, role="weights").start()
            self.pub = Publisher(cfg.announce)
            self._repeater = threading.Thread(target=self._reannounce, name="weights-announce", daemon=True)
            self._repeater.start()

    def publish(self, params) -> int:
        """Convert, pack, serve and announce `params` as the next version; returns it."""
        start = time.monotonic()
        version = self.version + 1
        infos, datas = [], []
        bucket_bytes = self.cfg.bucket_mb * 2**20
        for i, bucket in enumerate(hf_buckets(params, self.model_config, bucket_bytes, _NUMPY[self.cfg.dtype])):
            if self.serving:
                info, data = pack_bucket(i, bucket, self.cfg.dtype)
                infos.append(info)
                datas.append(data)
        self.version = version
        if self.serving:
            ann = WeightAnnounce(version=version, buckets=infos, total_bytes=sum(i.nbytes for i in infos),
                                 published_at=time.time())
            with self._lock:
                self._versions[version] = (ann, datas)
                while len(self._versions) > self.cfg.keep_versions:
                    self._versions.popitem(last=False)
                self.pub.send(ann)
            _write_version(self.state_file, version)
            log.info("published version %d: %d buckets, %.1f MB in %.2f s", version, len(infos),
                     ann.total_bytes / 1e6, time.monotonic() - start)
        return version

    def handle(self, msg: Message) -> Message:
        with self._lock:
            if isinstance(msg, WeightLatest):
                if not self._versions:
                    return Error(code="not_found", message="no version published yet")
                return next(reversed(self._versions.values()))[0]
            if isinstance(msg, WeightPull):
                return self._bucket(msg)
        return Error(code="bad_request", message=f"the weight publisher does not serve {type(msg).__name__}")

    def _bucket(self, msg: WeightPull) -> Message:
        served = self._versions.get(msg.version)
        if served is None:
            newest = next(reversed(self._versions), None)
            return Error(code="not_found", message=f"version {msg.version} is not served (newest: {newest})")
        ann, datas = served
        if not 0 <= msg.bucket < len(datas):
            return Error(code="not_found", message=f"version {msg.version} has buckets 0..{len(datas) - 1}")
        return WeightBucket(version=msg.version, bucket=msg.bucket, data=datas[msg.bucket])

    def _reannounce(self) -> None:
        while not self._stop.wait(self.cfg.reannounce_s):
            with self._lock:
                if self._versions:
                    self.pub.send(next(reversed(self._versions.values()))[0])

    def close(self) -> None:
        self._stop.set()
        if self.serving:
            self._repeater.join()
            self.server.stop()
            self.pub.close()


def _read_version(path: Path | None) -> int:
    if path is None or not path.exists():
        return 0
    return int(json.loads(path.read_text())["version"])


def _write_version(path: Path | None, version: int) -> None:
    """Atomically: a crash leaves the old record or the new one, never half of one."""
    if path is None:
        return
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"version": version, "time": time.time()}))
    os.replace(tmp, path)
