"""One-to-many announcements over ZeroMQ PUB/SUB (the trainer's new weight versions).

    pub = Publisher(cfg)                      # binds cfg.endpoint
    pub.send(WeightAnnounce(...))
    sub = Subscriber(cfg)                     # connects; asyncio
    msg = await sub.receive(timeout_s=1.0)    # the next message, or None

PUB drops what a subscriber was not connected for (ZeroMQ's slow joiner), so publishers
repeat their latest announcement and subscribers treat announcements as idempotent. An
unreadable message is logged and dropped; the subscriber keeps listening.
"""

from __future__ import annotations

import logging

import zmq
import zmq.asyncio

from dart_jax.wire import codec, curve
from dart_jax.wire.codec import WireError
from dart_jax.wire.config import WireConfig
from dart_jax.wire.messages import Message

log = logging.getLogger(__name__)


class Publisher:
    """A PUB socket bound to `cfg.endpoint`; `send` from one thread only."""

    def __init__(self, cfg: WireConfig):
        self.cfg = cfg
        self.ctx = zmq.Context()
        self.auth = curve.start_server_auth(self.ctx, cfg.curve) if cfg.curve else None
        self.sock = self.ctx.socket(zmq.PUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        if cfg.curve:
            curve.configure_server_socket(self.sock, cfg.curve)
        self.sock.bind(cfg.endpoint)
        self.endpoint = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)

    def send(self, msg: Message) -> None:
        self.sock.send_multipart(codec.encode(msg), copy=False)

    def close(self) -> None:
        self.sock.close(0)
        if self.auth:
            self.auth.stop()
        self.ctx.term()


class Subscriber:
    """A SUB socket (asyncio) connected to a Publisher's endpoint, subscribed to all."""

    def __init__(self, cfg: WireConfig):
        self.cfg = cfg
        self.ctx = zmq.asyncio.Context()
        self.sock = self.ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.MAXMSGSIZE, cfg.max_message_bytes)
        if cfg.curve:
            curve.configure_client_socket(self.sock, cfg.curve)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        self.sock.connect(cfg.endpoint)

    async def receive(self, timeout_s: float) -> Message | None:
        """The next readable message within `timeout_s`, else None."""
        if not await self.sock.poll(int(timeout_s * 1000)):
            return None
        frames = await self.sock.recv_multipart(copy=False)
        try:
            return codec.decode([f.buffer for f in frames], self.cfg.max_message_bytes)[1]
        except WireError as e:
            log.warning("dropping unreadable announcement from %s: %s", self.cfg.endpoint, e)
            return None

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()
