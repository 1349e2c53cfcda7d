"""1,000 malformed env-server messages: each gets an error reply; the server keeps serving."""

import random

import msgspec
import zmq

from dart_jax.wire import codec
from dart_jax.wire.messages import (EnvAcquire, EnvEvaluate, EnvHeartbeat, EnvListTasks, EnvRelease, EnvReply,
                                    EnvReset, EnvStatsRequest, EnvStep, Error, PROTOCOL_VERSION)
from envs.config import SyntheticSlots

from tests.envs.conftest import client, oracle_episode, run, spec

JUNK = [None, -1, 2**63, 3.5, "", "x" * 5000, b"\xff\x00", [], [1, "a"], {"k": 1}, True, {"type": "TaskSpec"}]


def _valid(lease_id: str) -> list:
    return [EnvAcquire(client_id="fuzz", backend="synthetic"), EnvHeartbeat(lease_ids=[lease_id, "nope"]),
            EnvReset(lease_id=lease_id, task=spec("synthetic", "form", 1)),
            EnvStep(lease_id=lease_id, step=0, action="Action: wait()"), EnvEvaluate(lease_id=lease_id),
            EnvRelease(lease_id="nope"), EnvListTasks(backend="synthetic"), EnvStatsRequest()]


def _mutate(rng: random.Random, msg) -> list[bytes]:
    body = msgspec.to_builtins(msg)
    op = rng.randrange(9)
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
        body["task"]["name"] = rng.choice(["nope", "", "../../etc"])
    elif op == 6:
        body["lease_id"] = rng.choice(["", "0" * 32, "x" * 1000])
    elif op == 7 and "step" in body:
        body["step"] = rng.choice([-1, 10**6])
    else:
        raw = bytearray(codec.encode(msg, 1)[0])
        raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
        return [bytes(raw)]
    return [msgspec.msgpack.encode([rng.choice([PROTOCOL_VERSION] * 5 + [0, 99]), 1, body])]


def test_fuzz_1000_malformed_messages(env_server):
    envs, endpoint = env_server(SyntheticSlots(count=2), lease_s=2.0)
    rng = random.Random(5)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(endpoint)
    # a live lease with an episode, so lease-bearing mutations reach the episode logic
    sock.send_multipart(codec.encode(EnvAcquire(client_id="fuzz", backend="synthetic"), 1))
    _, lease = codec.decode(sock.recv_multipart(), 1 << 26)
    sock.send_multipart(codec.encode(EnvReset(lease_id=lease.lease_id, task=spec("synthetic", "form", 1)), 1))
    assert isinstance(codec.decode(sock.recv_multipart(), 1 << 26)[1], EnvReply)
    valid = _valid(lease.lease_id)
    codes = {}
    for _ in range(1000):
        sock.send_multipart(_mutate(rng, rng.choice(valid)))
        assert sock.poll(10_000), "the env server stopped answering"
        _, reply = codec.decode(sock.recv_multipart(), 1 << 26)
        name = reply.code if isinstance(reply, Error) else type(reply).__name__
        codes[name] = codes.get(name, 0) + 1
    sock.close(0)
    ctx.term()
    assert "internal" not in codes, codes  # no malformed message crashed a handler
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
