"""ZeroMQ CURVE authentication for links between hosts.

Key files are ZeroMQ certificates (`NAME.key` public, `NAME.key_secret` secret), made by
`generate(dir, name)`. A server accepts only clients whose public key file lies in
`authorized_clients_dir` (checked by a ZAP authenticator thread); others never complete
the handshake, so their requests time out and never reach the handler.
"""

from __future__ import annotations

import re
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from dart_jax.config import UsageError
from dart_jax.wire.config import CurveConfig

NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")


def generate(directory: str | Path, name: str) -> tuple[Path, Path]:
    """Write a key pair; returns (public_key_file, secret_key_file). A name that is not a
    plain file name, or a directory that cannot be written, is a UsageError."""
    if not NAME.fullmatch(name):
        raise UsageError(f"key name {name!r}: letters, digits, '_', '.', '-' (it names the key files)")
    try:
        Path(directory).mkdir(parents=True, exist_ok=True)
        public, secret = zmq.auth.create_certificates(str(directory), name)
    except OSError as e:
        raise UsageError(f"{directory}: cannot write the key files there ({e.strerror})") from None
    return Path(public), Path(secret)


def _load(path: str, what: str, secret: bool) -> tuple[bytes, bytes | None]:
    if not path:
        raise ValueError(f"curve: {what} key file is not configured")
    try:
        public, secret_key = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as e:
        raise ValueError(f"curve: cannot load {what} key {path!r}: {e}") from None
    if secret and secret_key is None:
        raise ValueError(f"curve: {path!r} holds no secret key ({what})")
    return public, secret_key


def start_server_auth(ctx: zmq.Context, cfg: CurveConfig) -> ThreadAuthenticator:
    """Start the ZAP handler that admits only the authorized client keys."""
    if not cfg.authorized_clients_dir or not Path(cfg.authorized_clients_dir).is_dir():
        raise ValueError(f"curve: authorized_clients_dir {cfg.authorized_clients_dir!r} is not a directory")
    auth = ThreadAuthenticator(ctx)
    auth.start()
    auth.configure_curve(domain="*", location=cfg.authorized_clients_dir)
    return auth


def configure_server_socket(sock: zmq.Socket, cfg: CurveConfig) -> None:
    public, secret = _load(cfg.server_secret_key, "server secret", secret=True)
    sock.curve_publickey, sock.curve_secretkey = public, secret
    sock.curve_server = True


def configure_client_socket(sock: zmq.Socket, cfg: CurveConfig) -> None:
    server_public, _ = _load(cfg.server_public_key, "server public", secret=False)
    public, secret = _load(cfg.client_secret_key, "client secret", secret=True)
    sock.curve_serverkey = server_public
    sock.curve_publickey, sock.curve_secretkey = public, secret
