"""The weight publisher: the trainer side of weight sync, and what advances the policy version.

    publisher = WeightPublisher(cfg.weights, model_config, state_file=run.root / "weights.json",
                                version=trainer.version)
    version = publisher.publish(trainer.state.params)   # version = number of publishes

Every host of the trainer runs `publish`. Each converts its own shards on its devices
(`convert.to_hf_device`: HF layout, the rollout engine's dtype, no communication), copies
the blocks it owns to host memory and serves them from its own bucket server, so no host
receives a byte it does not serve and the fan-out is spread over every host. Process 0
announces the version before anything is converted (every host lays the version out from
shapes and shardings alone); tensors are converted in checkpoint order a few ahead of the
bucket being filled, each bucket is served the moment its pieces are in, and a pull of a
bucket not yet filled waits for it, so the transfer runs while later tensors still
convert. Each bucket reply carries an xxh3-64 checksum of its pieces. Buffers are reused:
the version that leaves the served window donates its device arrays to the next
conversion (on CPU those are the served host bytes themselves).

With `share_memory`, a host keeps the bytes it serves in shared-memory regions (one per
slot of the served window, `dart_jax.wire.shm`), and a worker on its machine that asks
for it is answered where a bucket lies instead of its bytes: its pull costs a copy per
byte, not a trip through the network stack. Workers elsewhere are sent bytes as before.

Versions only grow, across restarts too: `state_file` records the last one published, and
a resumed trainer publishes its restored weights under a new number (workers may hold a
version published after the checkpoint it resumed from). The count is the trainer's
`PolicyVersion` (`dart_jax.train.version`), which the publisher alone advances. The layout
of a version (which bytes of which devices fill which bucket) is `dart_jax.train.layout`'s.
The newest `keep_versions` versions are served, so a worker in the middle of a pull
finishes it.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import socket
import threading
import time
from collections import OrderedDict
from pathlib import Path

import jax
import numpy as np

from dart_jax.models.config import Qwen25VLConfig
from dart_jax.models.convert import hf_device_shapes, specs_for, to_hf_device
from dart_jax.train.layout import Layout, layout_for
from dart_jax.train.version import PolicyVersion, record, recorded
from dart_jax.wire import Server
from dart_jax.wire.config import WeightSyncConfig
from dart_jax.wire.messages import (Error, Message, WeightAnnounce, WeightBucket, WeightBucketShared, WeightLatest,
                                    WeightPull)
from dart_jax.wire.pubsub import Publisher
from dart_jax.wire.shm import Region, RegionDir, RegionError, available
from dart_jax.wire.weights import checksum

log = logging.getLogger(__name__)
LOOKAHEAD = 2  # parameters converted (device-to-host copies started) ahead of the bucket being filled


@dataclasses.dataclass
class Bucket:
    """One served bucket of this host: its frames, filled as the conversion proceeds."""
    frames: list[np.ndarray]
    ready: threading.Event
    checksum: int = 0
    offset: int = 0  # where its pieces start in the version's region, when it has one


@dataclasses.dataclass
class Served:
    announce: WeightAnnounce
    buckets: dict[int, Bucket]
    arrays: dict[tuple, jax.Array]  # the converted parameters, donated to a later version's conversion
    slot: int  # its place in the served window (and its shared-memory region's)
    region: Region | None = None


class WeightPublisher:
    def __init__(self, cfg: WeightSyncConfig, model_config: Qwen25VLConfig, *, state_file: Path | None = None,
                 version: PolicyVersion | None = None):
        self.cfg, self.model_config, self.state_file = cfg, model_config, state_file
        self.process, self.processes = jax.process_index(), jax.process_count()
        self.lead = self.process == 0
        self._version = PolicyVersion() if version is None else version  # advanced here alone
        self._version.value = recorded(state_file) if self.lead else 0
        if self.processes > 1:  # process 0's record holds (other hosts may not see the file)
            from jax.experimental import multihost_utils
            self._version.value = int(multihost_utils.broadcast_one_to_all(np.int64(self._version.value)))
        self._versions: OrderedDict[int, Served] = OrderedDict()
        self._changed = threading.Condition()
        self._layouts: dict[tuple, Layout] = {}
        self._stop = threading.Event()
        self.bytes_served = 0  # sent over the wire
        self.bytes_shared = 0  # taken through shared memory
        self.regions = None
        if cfg.share_memory:
            if available():
                self.regions = RegionDir()
            else:
                log.warning("weights.share_memory: this machine has no /dev/shm; workers are sent bytes")
        self.stages: dict[str, float] = {}  # the last publish's seconds by stage
        self.server = Server(cfg.host_serve(self.process), self.handle, role="weights", workers=cfg.serve_threads,
                             io_threads=cfg.io_threads, info=self.info).start()
        self.hosts = _exchange(self._advertised(), self.processes)
        self.pub = None
        if self.lead:
            self.pub = Publisher(cfg.announce)
            self._repeater = threading.Thread(target=self._reannounce, name="weights-announce", daemon=True)
            self._repeater.start()

    @property
    def version(self) -> int:
        """The newest version published (0: none yet)."""
        return self._version.value

    def _advertised(self) -> str:
        if not self.cfg.advertise:
            return self.server.endpoint
        port = self.server.endpoint.rpartition(":")[2]
        return self.cfg.advertise.format(host=socket.getfqdn(), process=self.process, port=port)

    # -- publishing
    def publish(self, params) -> int:
        """Announce, convert, fill and serve `params` as the next version; returns it."""
        start = time.perf_counter()
        version = self.version + 1
        layout = self._layout(params)
        ann = WeightAnnounce(version=version, hosts=self.hosts, tensors=layout.tensors, buckets=layout.buckets,
                             total_bytes=sum(b.nbytes for b in layout.buckets), published_at=time.time())
        reuse, slot = self._retire()
        region = self._region(slot, sum(b.nbytes for b in layout.buckets if b.host == self.process))
        served = Served(ann, {i: Bucket([], threading.Event()) for i in layout.local}, {}, slot, region)
        with self._changed:
            self._versions[version] = served
            self._changed.notify_all()
            if self.pub is not None:
                self.pub.send(ann)
        announced = time.perf_counter()
        times = self._fill(served, to_hf_device(params, self.model_config, self.cfg.dtype, reuse), layout)
        self._version.value = version
        if self.lead:
            record(self.state_file, version)
        end = time.perf_counter()
        local = sum(b.nbytes for b in layout.buckets if b.host == self.process)
        self.stages = {"announce_s": announced - start, **times, "publish_s": end - start,
                       "host_bytes": local, "bytes": ann.total_bytes}
        log.info("published version %d: %d buckets, %.1f MB (%.1f MB here) in %.2f s", version, len(layout.buckets),
                 ann.total_bytes / 1e6, local / 1e6, end - start)
        return version

    def _region(self, slot: int, nbytes: int) -> Region | None:
        """The slot's shared-memory region; None, and bytes for everyone from now on, when
        there is none or /dev/shm cannot hold it."""
        if self.regions is None:
            return None
        try:
            return self.regions.slot(slot, nbytes)
        except RegionError as e:
            log.warning("weights.share_memory: %s; workers are sent bytes", e)
            with self._changed:
                for served in self._versions.values():
                    served.region = None
            self.regions.close()
            self.regions = None
            return None

    def _retire(self) -> tuple[dict[tuple, jax.Array] | None, int]:
        """Stop serving the versions beyond the window; the last one's arrays, to reuse, and
        the slot the next version takes (a retired one's: its region is reused)."""
        reuse = None
        with self._changed:
            while len(self._versions) >= self.cfg.keep_versions:
                reuse = self._versions.popitem(last=False)[1].arrays
            used = {served.slot for served in self._versions.values()}
        return reuse, min(set(range(self.cfg.keep_versions)) - used)

    def _layout(self, params) -> Layout:
        shapes = hf_device_shapes(params, self.model_config, self.cfg.dtype)
        key = tuple((path, x.shape, x.dtype, x.sharding) for path, x in shapes.items())
        if key not in self._layouts:
            specs = specs_for(params, self.model_config)
            self._layouts = {key: layout_for(specs, shapes, self.cfg.dtype, self.cfg.bucket_mb * 2**20,
                                             self.processes, self.process)}
        return self._layouts[key]

    def _fill(self, served: Served, converting, layout: Layout) -> dict[str, float]:
        """Convert parameters in order, LOOKAHEAD ahead of the bucket being filled; copy this
        host's blocks to host memory and into its buckets (side by side in the version's
        region, when it has one), each served the moment its last piece is in. Every
        parameter is converted, served here or not (the program is the same on every host).
        Returns seconds by stage."""
        owned: dict[int, set] = {}
        for pieces in layout.local.values():
            for p in pieces:
                owned.setdefault(p.param, set()).add(p.device)
        arrays: list[jax.Array] = []
        hosted: dict[tuple[int, jax.Device], np.ndarray] = {}
        times = {"convert_s": 0.0, "host_copy_s": 0.0, "checksum_s": 0.0}

        def convert_through(param: int) -> None:
            start = time.perf_counter()
            for path, x in itertools.islice(converting, max(0, param + 1 + LOOKAHEAD - len(arrays))):
                served.arrays[path] = x
                for device in owned.get(len(arrays), ()):
                    _shard(x, device).copy_to_host_async()
                arrays.append(x)
            times["convert_s"] += time.perf_counter() - start

        at = 0  # in the region
        for index in sorted(layout.local):  # numbered in tensor order
            bucket = served.buckets[index]
            bucket.offset = at
            for p in layout.local[index]:
                convert_through(p.param)
                start = time.perf_counter()
                if (p.param, p.device) not in hosted:
                    hosted[p.param, p.device] = np.asarray(_shard(arrays[p.param], p.device)).reshape(-1).view(np.uint8)
                frame = hosted[p.param, p.device][p.offset:p.offset + p.nbytes]
                if served.region is not None:
                    frame = _put(served.region.data[at:at + p.nbytes], frame)
                    at += p.nbytes
                bucket.frames.append(frame)
                times["host_copy_s"] += time.perf_counter() - start
            start = time.perf_counter()
            bucket.checksum = checksum(bucket.frames)
            times["checksum_s"] += time.perf_counter() - start
            bucket.ready.set()
        convert_through(2**31)
        return times

    # -- serving
    def handle(self, msg: Message) -> Message:
        if isinstance(msg, WeightLatest):
            with self._changed:
                if not self._versions:
                    return Error(code="not_found", message="no version published yet")
                return next(reversed(self._versions.values())).announce
        if isinstance(msg, WeightPull):
            return self._bucket(msg)
        return Error(code="bad_request", message=f"the weight publisher does not serve {type(msg).__name__}")

    def _bucket(self, msg: WeightPull) -> Message:
        served = self._served(msg.version)
        if served is None:
            newest = next(reversed(self._versions), None)
            return Error(code="not_found", message=f"version {msg.version} is not served (newest: {newest})")
        bucket = served.buckets.get(msg.bucket)
        if bucket is None:
            n = len(served.announce.buckets)
            return Error(code="not_found", message=f"bucket {msg.bucket} of version {msg.version} is not served "
                                                   f"here (host {self.process}; the version has {n} buckets)")
        if not bucket.ready.wait(self.cfg.serve.timeout_s):
            return Error(code="unavailable", message=f"version {msg.version} bucket {msg.bucket} is not filled yet")
        nbytes = sum(f.nbytes for f in bucket.frames)
        if msg.shared and served.region is not None:
            with self._changed:
                self.bytes_shared += nbytes
            return WeightBucketShared(version=msg.version, bucket=msg.bucket, checksum=bucket.checksum,
                                      region=served.region.path, token=served.region.token, offset=bucket.offset)
        with self._changed:
            self.bytes_served += nbytes
        return WeightBucket(version=msg.version, bucket=msg.bucket, checksum=bucket.checksum, pieces=bucket.frames)

    def _served(self, version: int) -> Served | None:
        """The version, waiting for it while this host has yet to start it (process 0 may
        announce it before every host has queued its conversion)."""
        deadline = time.monotonic() + self.cfg.serve.timeout_s
        with self._changed:
            while version == self.version + 1 and version not in self._versions:
                if not self._changed.wait(max(0.0, deadline - time.monotonic())):
                    break
            return self._versions.get(version)

    def info(self) -> dict:
        return {"process": self.process, "version": self.version, "bytes_served": self.bytes_served,
                "bytes_shared": self.bytes_shared}

    def _reannounce(self) -> None:
        while not self._stop.wait(self.cfg.reannounce_s):
            with self._changed:
                if self._versions:
                    self.pub.send(next(reversed(self._versions.values())).announce)

    def close(self) -> None:
        self._stop.set()
        if self.pub is not None:
            self._repeater.join()
            self.pub.close()
        self.server.stop()
        if self.regions is not None:
            self.regions.close()


def _put(out: np.ndarray, frame: np.ndarray) -> np.ndarray:
    out[:] = frame
    return out


def _shard(x: jax.Array, device: jax.Device) -> jax.Array:
    return next(s.data for s in x.addressable_shards if s.device == device)


def _exchange(endpoint: str, processes: int) -> list[str]:
    """Every host's bucket-server endpoint, on every host (a few hundred bytes, once)."""
    if processes == 1:
        return [endpoint]
    from jax.experimental import multihost_utils
    raw = np.zeros(512, np.uint8)
    raw[:len(endpoint)] = np.frombuffer(endpoint.encode(), np.uint8)
    return [bytes(row).rstrip(b"\0").decode() for row in np.asarray(multihost_utils.process_allgather(raw))]

