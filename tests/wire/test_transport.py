import asyncio
import random

import msgspec
import pytest
import zmq

from dart_jax.testing.trajectories import make_trajectory
from dart_jax.wire import (AsyncClient, Client, CurveConfig, RemoteError, Server, WireConfig, WireError,
                           WireTimeout, codec, curve)
from dart_jax.wire.messages import Error, Ping, Pong, SubmitTrajectory, TaskRequest, TrajectoryAck

from tests.wire.conftest import LIMIT, ack_handler


def client_cfg(server, **kw):
    return WireConfig(endpoint=server.endpoint, timeout_s=5, max_message_bytes=LIMIT, **kw)


def test_request_reply_and_typed_errors(server):
    with Client(client_cfg(server)) as c:
        ack = c.request(SubmitTrajectory(trajectory=make_trajectory()))
        assert ack == TrajectoryAck(traj_id="t1", duplicate=False)
        with pytest.raises(RemoteError) as err:
            c.request(TaskRequest(worker_id="w", policy_version=0))
        assert err.value.code == "internal" and "unexpected TaskRequest" in err.value.message
        assert isinstance(c.request(Ping()), Pong)


def _mutations(valid: list[bytes], rng: random.Random):
    """Yield malformed messages of every kind: garbage, truncation, bit flips, oversize,
    unknown tags, wrong versions, bad array headers, stray frames."""
    header = valid[0]
    kinds = [
        lambda: [rng.randbytes(rng.randint(0, 64))],
        lambda: [header[: rng.randint(0, len(header) - 1)], *valid[1:]],
        lambda: [_flip(header, rng), *valid[1:]],
        lambda: [header, *valid[1: rng.randint(1, len(valid))]],
        lambda: [header, *valid[1:], rng.randbytes(8)],
        lambda: [header, *[rng.randbytes(len(f) + rng.choice([-1, 1])) for f in valid[1:]]],
        lambda: [msgspec.msgpack.encode([rng.randint(-5, 5), rng.randint(0, 99), {"type": "Nope"}])],
        lambda: [msgspec.msgpack.encode([1, 1, {"type": rng.choice(["Ping", "Step", "Error"]),
                                                "x": rng.random()}])],
        lambda: [b"\0" * (LIMIT + 1)],
        # over twice the limit in all, each frame under ZeroMQ's per-frame cap: still answered
        lambda: [header, *(bytes(rng.randint(LIMIT // 2, 2 * LIMIT)) for _ in range(rng.randint(2, 4)))],
        lambda: [],
    ]
    while True:
        frames = rng.choice(kinds)()
        yield frames if frames else [b""]


def _flip(data: bytes, rng: random.Random) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
    return bytes(out)


def test_fuzz_10000_messages_all_answered_server_alive(server, seed):
    rng = random.Random(seed)
    valid = [bytes(f) for f in codec.encode(SubmitTrajectory(trajectory=make_trajectory()), rid=1)]
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(server.endpoint)
    answered, outcomes = 0, set()
    fuzz = _mutations(valid, rng)
    for _ in range(100):
        for _ in range(100):
            sock.send_multipart(next(fuzz))
        for _ in range(100):
            assert sock.poll(5000), "server stopped answering"
            frames = sock.recv_multipart()
            _, reply = codec.decode(frames, LIMIT)
            assert isinstance(reply, (Error, TrajectoryAck))
            outcomes.add(reply.code if isinstance(reply, Error) else "ok")
            assert outcomes.isdisjoint({"internal"}), "a malformed message reached the handler"
            answered += 1
    sock.close(0)
    ctx.term()
    assert answered == 10_000
    assert {"bad_request", "unknown_message", "too_large", "version"} <= outcomes
    with Client(client_cfg(server)) as c:
        assert isinstance(c.request(Ping()), Pong)


def test_a_frame_over_the_hard_cap_drops_the_connection_and_the_peer_reconnects(server):
    """ZeroMQ refuses one frame over twice the limit before buffering it (MAXMSGSIZE): no
    reply can be sent; the DEALER reconnects by itself and its next request is answered."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(server.endpoint)
    sock.send_multipart(codec.encode(Ping(), 1))
    assert sock.poll(5000) and isinstance(codec.decode(sock.recv_multipart(), LIMIT)[1], Pong)
    served = server.served
    sock.send_multipart([codec.encode(Ping(), 2)[0], bytes(2 * LIMIT + 1)])
    assert not sock.poll(500) and server.served == served  # never reached the server
    sock.send_multipart(codec.encode(Ping(), 3))
    assert sock.poll(5000)
    assert codec.decode(sock.recv_multipart(), LIMIT)[0] == 3
    sock.close(0)
    ctx.term()


def test_clients_refuse_to_send_what_the_server_could_not_read(server):
    big = make_trajectory(steps=1)
    big.screenshots[0] = bytes(LIMIT)
    with Client(client_cfg(server)) as c:
        with pytest.raises(WireError) as err:
            c.request(SubmitTrajectory(trajectory=big))
        assert err.value.code == "too_large"
        assert isinstance(c.request(Ping()), Pong)

    async def main():
        client = AsyncClient(client_cfg(server))
        try:
            with pytest.raises(WireError, match="too_large"):
                await client.request(SubmitTrajectory(trajectory=big))
            return await client.request(Ping())
        finally:
            await client.aclose()

    assert isinstance(asyncio.run(main()), Pong)
    assert server.served == 2  # the two pings only


def test_a_reply_over_the_limit_becomes_a_too_large_error():
    def handler(msg):
        traj = make_trajectory(steps=1)
        traj.screenshots[0] = bytes(LIMIT)
        return SubmitTrajectory(trajectory=traj)

    srv = Server(WireConfig(endpoint="tcp://127.0.0.1:0", max_message_bytes=LIMIT), handler,
                 role="big").start()
    with Client(WireConfig(endpoint=srv.endpoint, timeout_s=5, max_message_bytes=LIMIT)) as c:
        with pytest.raises(RemoteError) as err:
            c.request(TaskRequest(worker_id="w", policy_version=0))
    srv.stop()
    assert err.value.code == "too_large" and "SubmitTrajectory reply" in err.value.message


def test_timeout_then_link_still_usable():
    slow = {"first": True}

    def handler(msg):
        if slow.pop("first", False):
            import time
            time.sleep(0.5)
        return TrajectoryAck(traj_id=msg.trajectory.traj_id, duplicate=False)

    srv = Server(WireConfig(endpoint="tcp://127.0.0.1:0"), handler, role="slow", workers=2).start()
    with Client(WireConfig(endpoint=srv.endpoint)) as c:
        with pytest.raises(WireTimeout):
            c.request(SubmitTrajectory(trajectory=make_trajectory(traj_id="a")), timeout_s=0.1)
        # The late reply to "a" is dropped by request id; "b" gets its own answer.
        assert c.request(SubmitTrajectory(trajectory=make_trajectory(traj_id="b"))).traj_id == "b"
    srv.stop()


def test_async_client_concurrent_requests():
    srv = Server(WireConfig(endpoint="tcp://127.0.0.1:0"), ack_handler, role="async", workers=4).start()

    async def main():
        client = AsyncClient(WireConfig(endpoint=srv.endpoint, timeout_s=5))
        msgs = [SubmitTrajectory(trajectory=make_trajectory(traj_id=str(i))) for i in range(50)]
        replies = await asyncio.gather(*(client.request(m) for m in msgs))
        await client.aclose()
        return [r.traj_id for r in replies]

    assert asyncio.run(main()) == [str(i) for i in range(50)]
    srv.stop()


def test_non_loopback_bind_needs_allow_remote():
    with pytest.raises(ValueError, match="not loopback"):
        WireConfig(endpoint="tcp://0.0.0.0:5555")
    assert WireConfig(endpoint="tcp://0.0.0.0:5555", allow_remote=True).allow_remote
    with pytest.raises(ValueError, match="expected tcp://HOST:PORT"):
        WireConfig(endpoint="tcp://127.0.0.1")


def test_curve_refuses_unauthenticated_clients(tmp_path):
    _, server_secret = curve.generate(tmp_path / "server", "server")
    _, good_secret = curve.generate(tmp_path / "authorized", "worker")
    _, bad_secret = curve.generate(tmp_path / "stranger", "stranger")
    server_cfg = CurveConfig(server_secret_key=str(server_secret),
                             authorized_clients_dir=str(tmp_path / "authorized"))
    srv = Server(WireConfig(endpoint="tcp://127.0.0.1:0", curve=server_cfg), ack_handler,
                 role="curve").start()
    server_public = str(tmp_path / "server" / "server.key")

    def cfg(secret):
        keys = CurveConfig(server_public_key=server_public, client_secret_key=str(secret))
        return WireConfig(endpoint=srv.endpoint, timeout_s=1.0, curve=keys if secret else None)

    with Client(cfg(good_secret)) as c:
        assert isinstance(c.request(Ping()), Pong)
    for secret in (bad_secret, None):
        with Client(cfg(secret)) as c, pytest.raises(WireTimeout):
            c.request(Ping())
    assert srv.served == 1  # the refused clients never reached the handler
    srv.stop()


def test_pooled_server_stops_promptly_after_handler_faults():
    srv = Server(WireConfig(endpoint="tcp://127.0.0.1:0"), ack_handler, role="stop", workers=3).start()
    with Client(WireConfig(endpoint=srv.endpoint, timeout_s=5)) as c:
        for _ in range(6):  # handler exceptions, logged with tracebacks, on every pool thread
            with pytest.raises(RemoteError):
                c.request(TaskRequest(worker_id="w", policy_version=0))
    import time
    start = time.monotonic()
    srv.stop()
    assert not srv._thread.is_alive() and time.monotonic() - start < 3
