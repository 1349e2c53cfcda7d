"""Config of one wire link: endpoint, timeouts, limits and optional CURVE keys."""

from __future__ import annotations

import dataclasses
import ipaddress
from urllib.parse import urlsplit

from dart_jax.config import bounded


@dataclasses.dataclass(frozen=True)
class CurveConfig:
    """CURVE keys (files written by `dart-jax keys`). Server: its secret key and a
    directory of authorized client public keys. Client: the server's public key and its
    own secret key. Links between hosts should always set this."""
    server_public_key: str = ""
    server_secret_key: str = ""
    client_secret_key: str = ""
    authorized_clients_dir: str = ""


@dataclasses.dataclass(frozen=True)
class WireConfig:
    endpoint: str
    timeout_s: float = bounded(30.0, gt=0)
    max_message_bytes: int = bounded(256 * 2**20, ge=1024)
    allow_remote: bool = False  # bind to a non-loopback address only when set
    curve: CurveConfig | None = None

    def __post_init__(self) -> None:
        check_endpoint(self.endpoint, self.allow_remote)


def check_endpoint(endpoint: str, allow_remote: bool) -> None:
    """Reject malformed endpoints and non-loopback tcp binds unless allowed."""
    scheme, _, rest = endpoint.partition("://")
    if scheme in ("ipc", "inproc") and rest:
        return
    if scheme != "tcp":
        raise ValueError(f"endpoint {endpoint!r}: expected tcp://HOST:PORT, ipc:// or inproc://")
    parts = urlsplit(endpoint)
    try:
        port = parts.port
    except ValueError:
        port = None
    if not parts.hostname or port is None:
        raise ValueError(f"endpoint {endpoint!r}: expected tcp://HOST:PORT")
    if not allow_remote and not _is_loopback(parts.hostname):
        raise ValueError(f"endpoint {endpoint!r} is not loopback; set allow_remote: true "
                         "(and curve keys) to expose it")


def is_loopback_endpoint(endpoint: str) -> bool:
    """Whether a tcp endpoint's host is a loopback address (this machine)."""
    scheme, _, _ = endpoint.partition("://")
    return scheme == "tcp" and _is_loopback(urlsplit(endpoint).hostname or "")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


WEIGHT_DTYPES = ("float32", "bfloat16", "float16")


@dataclasses.dataclass(frozen=True)
class WeightSyncConfig:
    """How weight versions travel (dart_jax.train.publish -> rollout_gpu.vllm_ext).

    Process 0 of the trainer announces each version on `announce` (PUB); every trainer host
    serves the blocks of the parameters it holds on its own bucket server: host 0 binds
    `serve.endpoint`, host i the same endpoint with the port raised by i (tcp) or `-i`
    appended to the path (ipc). Workers reach host i at `advertise` when set (`{host}`: the
    host's name, `{port}`: the port it bound, `{process}`: i; e.g. `tcp://{host}:{port}` for
    hosts bound to 0.0.0.0), else at the endpoint it bound. `dtype` is what travels
    and what the engine loads: the rollout engine's dtype (the run config checks).
    No message exceeds `serve.max_message_bytes`, whatever the tensor: a block larger
    than a bucket is cut into rows across buckets and reassembled by the worker.
    `share_memory`: each host also keeps what it serves in /dev/shm, and a worker on its
    machine (an ipc or loopback endpoint) copies buckets from there instead of receiving
    them (the local configs, where the trainer and the engines share one machine)."""
    announce: WireConfig = WireConfig(endpoint="tcp://127.0.0.1:5560")
    serve: WireConfig = WireConfig(endpoint="tcp://127.0.0.1:5561")
    advertise: str = ""
    dtype: str = "float32"
    bucket_mb: int = bounded(4, ge=1)  # small messages recycle the receiver's buffers
    keep_versions: int = bounded(2, ge=1)  # versions served at once (a slow puller finishes)
    reannounce_s: float = bounded(2.0, gt=0)  # PUB drops what slow joiners missed
    pull_timeout_s: float = bounded(300.0, gt=0)  # one whole version (serve.timeout_s: one bucket)
    serve_threads: int = bounded(8, ge=1)  # bucket requests answered at once, per trainer host
    io_threads: int = bounded(2, ge=1)  # ZeroMQ threads writing buckets to sockets, per host
    pull_depth: int = bounded(4, ge=1)  # bucket requests a worker keeps in flight per host
    share_memory: bool = False  # serve workers on this machine through /dev/shm (dart_jax.wire.shm)

    def __post_init__(self) -> None:
        if self.dtype not in WEIGHT_DTYPES:
            raise ValueError(f"dtype {self.dtype!r}: one of {WEIGHT_DTYPES}")
        if self.bucket_mb * 2**20 > self.serve.max_message_bytes - 2**20:
            raise ValueError(f"bucket_mb {self.bucket_mb} does not fit serve.max_message_bytes "
                             f"{self.serve.max_message_bytes} (leave 1 MiB for the header)")

    def host_serve(self, process: int) -> WireConfig:
        """The bucket server trainer host `process` binds."""
        return dataclasses.replace(self.serve, endpoint=host_endpoint(self.serve.endpoint, process))


def host_endpoint(endpoint: str, process: int) -> str:
    """`endpoint` for trainer host `process`: port + process (tcp; port 0 stays 0), path
    + `-process` (ipc), unchanged for host 0."""
    if process == 0:
        return endpoint
    scheme, _, rest = endpoint.partition("://")
    if scheme == "tcp":
        host, _, port = rest.rpartition(":")
        return f"tcp://{host}:{int(port) + process if int(port) else 0}"
    return f"{endpoint}-{process}"
