"""Hostile ids, names, numbers and task-file paths to every env-server request: each is
refused with a typed error naming the field, the files they point at are never read, and
the server keeps serving."""

import json

import pytest

from dart_jax.wire import RemoteError
from dart_jax.wire.messages import (EnvAcquire, EnvEvaluate, EnvHeartbeat, EnvListTasks, EnvRelease, EnvReset,
                                    EnvStep, TaskSpec)
from envs.config import OSWorldSlots, SyntheticSlots

from tests.envs.conftest import INFEASIBLE_TASK, client, oracle_episode, run, spec

ODD = ["../../x", "/abs/x", "a/b", "x" * 10_000, ".hidden", "-rf", "a b", "ok\n", "nul\x00", "caf\u00e9", "$(id)"]
ODD_TASK_IDS = ["../x", "synthetic/../x", "/abs", "synthetic/", "x" * 300, "t\n", "t 0", ""]
ODD_BACKENDS = ["../x", "Synthetic", "a b", "x" * 100, "syn\n"]


async def refused(wire, msg, code: str, field: str) -> None:
    with pytest.raises(RemoteError) as err:
        await wire.request(msg)
    assert err.value.code == code and field in err.value.message, err.value


async def _hostile_requests(wire, lease: str) -> None:
    for bad in ODD:
        await refused(wire, EnvAcquire(client_id=bad), "bad_request", "$.client_id")
        await refused(wire, EnvHeartbeat(lease_ids=[lease, bad]), "bad_request", "$.lease_ids[1]")
        for make in (lambda v: EnvReset(lease_id=v, task=spec("synthetic", "form")), EnvEvaluate, EnvRelease,
                     lambda v: EnvStep(lease_id=v, step=0, action="Action: wait()")):
            await refused(wire, make(bad), "bad_request", "$.lease_id")
        task = TaskSpec(task_id="synthetic/form/0", backend="synthetic", name=bad)
        await refused(wire, EnvReset(lease_id=lease, task=task), "bad_request", "$.task.name")
    for bad in ODD_TASK_IDS:
        task = TaskSpec(task_id=bad, backend="synthetic", name="form")
        await refused(wire, EnvReset(lease_id=lease, task=task), "bad_request", "$.task.task_id")
    for bad in ODD_BACKENDS:
        await refused(wire, EnvAcquire(client_id="ok", backend=bad), "bad_request", "$.backend")
        await refused(wire, EnvListTasks(backend=bad), "bad_request", "$.backend")
    for step in (-1, 2**31, 2**64 - 1):
        await refused(wire, EnvStep(lease_id=lease, step=step, action="Action: wait()"), "bad_request", "$.step")
    task = TaskSpec(task_id="synthetic/form/0", backend="synthetic", name="form", seed=-1)
    await refused(wire, EnvReset(lease_id=lease, task=task), "bad_request", "$.task.seed")


def test_every_request_checks_its_ids_names_and_numbers(env_server):
    _, endpoint = env_server(SyntheticSlots(count=1))

    async def main():
        c = client(endpoint)
        try:
            lease = (await c.wire.request(EnvAcquire(client_id="ok", backend="synthetic"))).lease_id
            await _hostile_requests(c.wire, lease)
            await c.wire.request(EnvRelease(lease_id=lease))
            env = await c.acquire("synthetic", wait_s=5)
            return await oracle_episode(env, spec("synthetic", "form", 2))
        finally:
            await c.aclose()

    assert run(main()).reward == 1.0  # still serving


@pytest.fixture
def osworld(env_server, fake_vm, tmp_path):
    """An OSWorld slot on the fake VM whose task files live in tmp_path/tasks; a secret file
    beside that directory and a symlink to it inside."""
    tasks, secret = tmp_path / "tasks", tmp_path / "secret.json"
    tasks.mkdir()
    (tasks / "ok.json").write_text(json.dumps(INFEASIBLE_TASK))
    secret.write_text(json.dumps({**INFEASIBLE_TASK, "instruction": "the secret"}))
    (tasks / "link.json").symlink_to(secret)
    _, endpoint = env_server(OSWorldSlots(provider="remote", remote_urls=(fake_vm.url,), settle_s=0.0,
                                          task_dir=str(tasks)))
    return endpoint, tasks, secret


def _reset(env, config: dict):
    return env.reset(TaskSpec(task_id="osworld/x", backend="osworld", name="x", config=json.dumps(config)))


def test_osworld_task_files_stay_inside_the_task_dir(osworld):
    endpoint, tasks, secret = osworld

    async def main():
        c = client(endpoint)
        env = await c.acquire("osworld")
        messages = []
        for config in ({"path": "../secret.json"}, {"path": str(secret)}, {"path": "link.json"},
                       {"path": "/etc/passwd"}, {"path": ["ok.json"]}, {"example": str(secret)},
                       {"example": "/etc/passwd"}):
            with pytest.raises(RemoteError) as err:
                await _reset(env, config)
            assert err.value.code == "bad_request", err.value
            messages.append(err.value.message)
        reply = await _reset(env, {"path": "ok.json"})  # what the directory holds is served
        await c.aclose()
        return messages, reply

    messages, reply = run(main())
    assert all("the secret" not in m for m in messages)
    assert sum("outside" in m for m in messages) == 3 and "'..'" in messages[0]
    assert reply.status == "ok" and reply.observation.instruction == INFEASIBLE_TASK["instruction"]


def test_osworld_without_a_task_dir_reads_no_files(env_server, fake_vm, tmp_path):
    (tmp_path / "t.json").write_text(json.dumps(INFEASIBLE_TASK))
    _, endpoint = env_server(OSWorldSlots(provider="remote", remote_urls=(fake_vm.url,), settle_s=0.0))

    async def main():
        c = client(endpoint)
        env = await c.acquire("osworld")
        try:
            with pytest.raises(RemoteError, match="bad_request: .*needs the slots' task_dir"):
                await _reset(env, {"path": str(tmp_path / "t.json")})
            return await _reset(env, {"example": INFEASIBLE_TASK})
        finally:
            await c.aclose()

    assert run(main()).status == "ok"
