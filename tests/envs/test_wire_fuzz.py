"""1,000 malformed, hostile and oversize env-server messages: every one the transport can
answer gets an error reply; one frame over ZeroMQ's hard cap drops the connection unread
(the documented behaviour, dart_jax.wire.transport); the server keeps serving throughout."""

import random

import msgspec
import zmq

from dart_jax.wire import codec
from dart_jax.wire.messages import (EnvAcquire, EnvEvaluate, EnvHeartbeat, EnvListTasks, EnvRelease, EnvReply,
                                    EnvReset, EnvStatsRequest, EnvStep, Error, PROTOCOL_VERSION)
from envs.config import SyntheticSlots

from tests.envs.conftest import client, oracle_episode, run, spec

LIMIT = 1 << 20  # the fuzzed server's max_message_bytes; ZeroMQ drops single frames over 2x
JUNK = [None, -1, 2**63, 3.5, "", "x" * 5000, b"\xff\x00", [], [1, "a"], {"k": 1}, True, {"type": "TaskSpec"}]
HOSTILE = ["../../etc/passwd", "/etc/passwd", "a/../../b", "x" * 10_000, "a b", "ok\n", "-rf", ".hidden",
           "caf\u00e9", "nul\x00", "semi;colon", "a/b"]
OVERSIZE, ANSWERED, DROPPED = 30, 20, 10  # how many oversize messages of the 1,000, and their fates


def _valid(lease_id: str) -> list:
    return [EnvAcquire(client_id="fuzz", backend="synthetic"), EnvHeartbeat(lease_ids=[lease_id, "nope"]),
            EnvReset(lease_id=lease_id, task=spec("synthetic", "form", 1)),
            EnvStep(lease_id=lease_id, step=0, action="Action: wait()"), EnvEvaluate(lease_id=lease_id),
            EnvRelease(lease_id="nope"), EnvListTasks(backend="synthetic"), EnvStatsRequest()]


def _mutate(rng: random.Random, msg) -> list[bytes]:
    body = msgspec.to_builtins(msg)
    op = rng.randrange(10)
    keys = [k for k in body if k != "type"]
    if op == 0 and keys:
        del body[rng.choice(keys)]
    elif op == 1 and keys:
        body[rng.choice(keys)] = rng.choice(JUNK)
    elif op == 2:
        body["unexpected"] = 1
    elif op == 3:
        body["type"] = rng.choice(["EnvNope", "", "Trajectory", "TaskSpec", 7])
    elif op == 4 and "task" in body:
        body["task"]["config"] = rng.choice(["{not json", "[1]", '{"difficulty": 9}', '"str"'])
    elif op == 5 and "task" in body:
        body["task"][rng.choice(["name", "task_id", "backend"])] = rng.choice(["nope", "", *HOSTILE])
    elif op == 6:
        body["lease_id"] = rng.choice(["", "0" * 32, "x" * 1000, *HOSTILE])
    elif op == 7 and "step" in body:
        body["step"] = rng.choice([-1, 10**6, 2**31, 2**63])
    elif op == 8 and keys:  # a hostile value in whichever id or name field the message has
        field = rng.choice([k for k in ("client_id", "backend", "lease_ids", "lease_id") if k in body] or keys)
        body[field] = [rng.choice(HOSTILE)] if field == "lease_ids" else rng.choice(HOSTILE)
    else:
        raw = bytearray(codec.encode(msg, 1)[0])
        raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
        return [bytes(raw)]
    return [msgspec.msgpack.encode([rng.choice([PROTOCOL_VERSION] * 5 + [0, 99]), 1, body])]


def _oversize(rng: random.Random, msg, answerable: bool) -> list[bytes]:
    """Over the limit: in one frame under ZeroMQ's cap or in several (answerable: a typed
    `too_large`), or in one frame over the cap (dropped unread)."""
    header = codec.encode(msg, 1)[0]
    if not answerable:
        return [header, bytes(2 * LIMIT + rng.randint(1, 4096))]
    if rng.random() < 0.5:
        return [header, bytes(rng.randint(LIMIT, 2 * LIMIT - len(header)))]
    return [header, *(bytes(rng.randint(LIMIT // 2, 2 * LIMIT)) for _ in range(rng.randint(2, 4)))]


def test_fuzz_1000_malformed_hostile_and_oversize_messages(env_server, seed):
    envs, endpoint = env_server(SyntheticSlots(count=2), lease_s=2.0, max_message_bytes=LIMIT)
    rng = random.Random(seed)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(endpoint)
    # a live lease with an episode, so lease-bearing mutations reach the episode logic
    sock.send_multipart(codec.encode(EnvAcquire(client_id="fuzz", backend="synthetic"), 1))
    _, lease = codec.decode(sock.recv_multipart(), 1 << 26)
    sock.send_multipart(codec.encode(EnvReset(lease_id=lease.lease_id, task=spec("synthetic", "form", 1)), 1))
    assert isinstance(codec.decode(sock.recv_multipart(), 1 << 26)[1], EnvReply)
    valid = _valid(lease.lease_id)
    oversize = dict(zip(rng.sample(range(1000), OVERSIZE), [True] * ANSWERED + [False] * DROPPED))
    codes, dropped = {}, 0
    for i in range(1000):
        msg = rng.choice(valid)
        sock.send_multipart(_oversize(rng, msg, oversize[i]) if i in oversize else _mutate(rng, msg))
        if oversize.get(i) is False:
            assert not sock.poll(300), "a frame over ZeroMQ's hard cap was answered"
            dropped += 1
            continue
        assert sock.poll(10_000), f"the env server stopped answering (message {i})"
        _, reply = codec.decode(sock.recv_multipart(), 1 << 26)
        name = reply.code if isinstance(reply, Error) else type(reply).__name__
        codes[name] = codes.get(name, 0) + 1
    sock.close(0)
    ctx.term()
    assert "internal" not in codes, codes  # no malformed message crashed a handler
    assert codes.get("too_large", 0) == ANSWERED and dropped == DROPPED, codes
    assert sum(v for k, v in codes.items() if k in ("bad_request", "unknown_message", "version", "not_found",
                                                        "conflict", "unavailable")) > 600, codes
    # still serving: a real episode end to end
    async def episode():
        c = client(endpoint)
        env = await c.acquire("synthetic", wait_s=10)
        reward = await oracle_episode(env, spec("synthetic", "check-boxes", 3))
        await c.aclose()
        return reward

    assert run(episode()).reward == 1.0
