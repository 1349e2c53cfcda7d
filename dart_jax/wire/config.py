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


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
