"""Request/reply over ZeroMQ: a fault-containing ROUTER server and DEALER clients.

    server = Server(cfg, handler, role="data-manager").start()   # background thread
    with Client(cfg) as c:
        reply = c.request(TaskRequest(worker_id="w0", policy_version=3))

Every request carries an id and gets exactly one reply: the handler's result or a typed
`Error`. Malformed, oversized, unknown or version-mismatched messages, and exceptions in
the handler, become error replies plus a log line; the server keeps serving. Handlers
may run in a thread pool (`workers > 0`) so slow requests (env steps) do not block
others; replies are funnelled back to the socket's thread, as ZeroMQ sockets are not
thread-safe. Clients use DEALER sockets, so a timed-out request never wedges the link and
late replies are dropped by id.

Size limit (`max_message_bytes`, all frames together): a request over it gets a `too_large`
reply; a reply over it is replaced by a `too_large` error, as the peer would drop it unread;
our clients refuse to send a message over it (a local `too_large` WireError). One frame over
twice the limit is refused by ZeroMQ itself (MAXMSGSIZE, checked per frame before it is
buffered): it never reaches the server, which cannot answer it; the peer's connection is
dropped, its DEALER reconnects on its own and its later requests are served.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import zmq
import zmq.asyncio

from dart_jax.wire import codec, curve
from dart_jax.wire.codec import WireError
from dart_jax.wire.config import WireConfig
from dart_jax.wire.messages import Error, Message, Ping, Pong

log = logging.getLogger(__name__)
Handler = Callable[[Message], Message]


class RemoteError(Exception):
    """The peer answered with an `Error` reply."""

    def __init__(self, error: Error):
        super().__init__(f"{error.code}: {error.message}")
        self.code, self.message = error.code, error.message


class WireTimeout(TimeoutError):
    """No reply within the request's timeout."""


class Cancelled(Exception):
    """The caller's cancel event was set while a request waited for its reply."""


class Server:
    """Serves `handler` on a ROUTER socket bound to `cfg.endpoint`."""

    def __init__(self, cfg: WireConfig, handler: Handler, *, role: str, workers: int = 0,
                 info: Callable[[], dict] | None = None, io_threads: int = 1):
        self.cfg, self.handler, self.role, self.info = cfg, handler, role, info
        self.ctx = zmq.Context(io_threads=io_threads)
        self.auth = curve.start_server_auth(self.ctx, cfg.curve) if cfg.curve else None
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        # Hard cap per frame well above the app limit so a huge frame is refused without
        # buffering it all (the connection drops: see the module docstring); messages
        # between the two limits get a typed `too_large` reply.
        self.sock.setsockopt(zmq.MAXMSGSIZE, 2 * cfg.max_message_bytes)
        if cfg.curve:
            curve.configure_server_socket(self.sock, cfg.curve)
        self.sock.bind(cfg.endpoint)
        self.endpoint = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix=role) if workers else None
        self._inbox = f"inproc://replies-{id(self)}"
        self._pull = self.ctx.socket(zmq.PULL)
        self._pull.bind(self._inbox)
        self._local = threading.local()
        self._pushes: list[zmq.Socket] = []  # one per pool thread, closed at shutdown
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.started = time.monotonic()
        self.served = 0

    def start(self) -> "Server":
        self._thread = threading.Thread(target=self.serve_forever, name=f"{self.role}-wire", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        poller.register(self._pull, zmq.POLLIN)
        while not self._stop.is_set():
            events = dict(poller.poll(100))
            if self._pull in events:
                self.sock.send_multipart(self._pull.recv_multipart(copy=False), copy=False)
            if self.sock in events:
                self._receive()
        self._close()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)

    def _receive(self) -> None:
        frames = self.sock.recv_multipart(copy=False)
        # ROUTER prepends the peer identity; DEALER clients send no empty delimiter.
        peer, payload = frames[0], [f.buffer for f in frames[1:]]
        self.served += 1
        if self.pool is None:
            self.sock.send_multipart([peer, *self._answer(payload)], copy=False)
        else:
            self.pool.submit(self._answer_async, peer, payload)

    def _answer_async(self, peer, payload) -> None:
        reply = self._answer(payload)
        push = getattr(self._local, "push", None)
        if push is None:
            push = self._local.push = self.ctx.socket(zmq.PUSH)
            push.setsockopt(zmq.LINGER, 0)
            push.connect(self._inbox)
            self._pushes.append(push)
        push.send_multipart([peer, *reply], copy=False)

    def _answer(self, payload) -> list:
        rid = codec.peek_rid(payload)
        try:
            rid, msg = codec.decode(payload, self.cfg.max_message_bytes)
            reply = self._pong() if isinstance(msg, Ping) else self.handler(msg)
        except WireError as e:
            log.warning("%s: rejected request %d: %s", self.role, rid, e)
            reply = Error(code=e.code, message=e.message)
        except Exception as e:  # contain handler faults: reply, log, keep serving
            log.exception("%s: handler failed on request %d", self.role, rid)
            reply = Error(code="internal", message=f"{type(e).__name__}: {e}")
        try:
            frames = codec.encode(reply, rid)
            codec.check_size(frames, self.cfg.max_message_bytes)  # the peer would drop it unread
            return frames
        except WireError as e:
            log.error("%s: reply %s to request %d refused: %s", self.role, type(reply).__name__, rid, e)
            return codec.encode(Error(code=e.code, message=f"the {type(reply).__name__} reply: {e.message}"), rid)
        except Exception as e:
            log.exception("%s: reply to request %d could not be encoded", self.role, rid)
            return codec.encode(Error(code="internal", message=f"unencodable reply: {e}"), rid)

    def _pong(self) -> Pong:
        info = {"served": self.served, **(self.info() if self.info else {})}
        return Pong(role=self.role, pid=os.getpid(), uptime_s=time.monotonic() - self.started, info=info)

    def _close(self) -> None:
        if self.pool:
            self.pool.shutdown(wait=True, cancel_futures=True)
        for push in self._pushes:  # the pool's threads are gone: safe to close here
            push.close(0)
        self.sock.close(0)
        self._pull.close(0)
        if self.auth:
            self.auth.stop()
        self.ctx.term()


def _client_socket(ctx: zmq.Context, cfg: WireConfig) -> zmq.Socket:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if cfg.curve:
        curve.configure_client_socket(sock, cfg.curve)
    sock.connect(cfg.endpoint)
    return sock


def _encode_request(msg: Message, rid: int, cfg: WireConfig) -> list:
    """Frames of a request, refused here (WireError `too_large`) when the server would be
    unable to read it."""
    frames = codec.encode(msg, rid)
    codec.check_size(frames, cfg.max_message_bytes)
    return frames


def _result(reply: Message) -> Message:
    if isinstance(reply, Error):
        raise RemoteError(reply)
    return reply


class Client:
    """Blocking client; one request at a time per instance (use one per thread). Clients
    on many threads may share one ZeroMQ context (`ctx`, which the caller then closes)."""

    def __init__(self, cfg: WireConfig, ctx: zmq.Context | None = None):
        self.cfg = cfg
        self._own_ctx = ctx is None
        self.ctx = zmq.Context() if ctx is None else ctx
        self.sock = _client_socket(self.ctx, cfg)
        self._rids = itertools.count(1)

    def request(self, msg: Message, timeout_s: float | None = None,
                cancel: threading.Event | None = None) -> Message:
        """The reply to `msg`; raises RemoteError for an Error reply, WireTimeout, WireError
        `too_large` for a message over the size limit (not sent), and Cancelled within
        0.1 s of `cancel` being set."""
        rid = next(self._rids)
        self.sock.send_multipart(_encode_request(msg, rid, self.cfg), copy=False)
        deadline = time.monotonic() + (timeout_s or self.cfg.timeout_s)
        while (left := deadline - time.monotonic()) > 0:
            if cancel is not None and cancel.is_set():
                raise Cancelled(f"request to {self.cfg.endpoint} cancelled")
            if not self.sock.poll(int(min(left, 0.1 if cancel is not None else left) * 1000) + 1):
                continue
            frames = self.sock.recv_multipart(copy=False)
            got, reply = codec.decode([f.buffer for f in frames], self.cfg.max_message_bytes)
            if got == rid:
                return _result(reply)
        raise WireTimeout(f"no reply from {self.cfg.endpoint} in {timeout_s or self.cfg.timeout_s} s")

    def close(self) -> None:
        self.sock.close(0)
        if self._own_ctx:
            self.ctx.term()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AsyncClient:
    """asyncio client: many coroutines may await requests concurrently on one socket."""

    def __init__(self, cfg: WireConfig):
        self.cfg = cfg
        self.ctx = zmq.asyncio.Context()
        self.sock = _client_socket(self.ctx, cfg)
        self._rids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self._reader: asyncio.Task | None = None

    async def request(self, msg: Message, timeout_s: float | None = None) -> Message:
        if self._reader is None:
            self._reader = asyncio.get_running_loop().create_task(self._read())
        rid = next(self._rids)
        frames = _encode_request(msg, rid, self.cfg)
        fut = self._pending[rid] = asyncio.get_running_loop().create_future()
        try:
            await self.sock.send_multipart(frames, copy=False)
            reply = await asyncio.wait_for(fut, timeout_s or self.cfg.timeout_s)
        except asyncio.TimeoutError:
            raise WireTimeout(f"no reply from {self.cfg.endpoint}") from None
        finally:
            self._pending.pop(rid, None)
        return _result(reply)

    async def _read(self) -> None:
        while True:
            frames = await self.sock.recv_multipart(copy=False)
            try:
                rid, reply = codec.decode([f.buffer for f in frames], self.cfg.max_message_bytes)
            except WireError as e:
                log.warning("dropping unreadable reply from %s: %s", self.cfg.endpoint, e)
                continue
            fut = self._pending.get(rid)
            if fut is not None and not fut.done():
                fut.set_result(reply)

    async def aclose(self) -> None:
        if self._reader:
            self._reader.cancel()
        self.sock.close(0)
        self.ctx.term()
