"""The Ray launcher on a real two-node Ray cluster (two `ray start` on this machine, the head
holding the `envs` resource and a second node the `rollout` one): an env server and a vLLM CPU
rollout worker as Ray actors against a data manager the supervisor runs locally, each killed
once; and an actor that cannot start, reported as a dead role with Ray's reason.

Each row is a placement group, and each actor lands on the node holding its row's resource.
The nodes run without this checkout on their path: the actors and their roles import the
code the job's runtime_env carries. The env server and the data manager bind every interface
(tcp://0.0.0.0:PORT) and the rollout worker reaches them at their nodes' addresses, as across
hosts. Killing the env server's role process (the actor lives on) makes the supervisor
replace its actor; killing the rollout worker's actor process makes Ray restart the actor in
its bundle, which starts the worker again, and its vLLM engine dies with the old worker.
After the kills more trajectories reach the data manager's store, and nothing the worker saw
acknowledged is lost or stored twice.
"""

import json
import os
import signal
import time
from pathlib import Path
from typing import Callable

import psutil
import pytest
import ray

from dart_jax.config import load
from dart_jax.run.launchers.config import RoleSpec
from dart_jax.run.main import prepare, with_policy
from dart_jax.run.launchers.local import Instance
from dart_jax.run.launchers.ray import RayLauncher, RayProcess
from dart_jax.run.schema import RunConfig
from dart_jax.run.supervisor import Member, Supervisor
from dart_jax.wire import Client
from dart_jax.wire.messages import StatsRequest
from tests.net import free_port
from tests.stores import content_duplicates, stored_ids

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[3]


def _config(tmp: Path, ray_address: str) -> RunConfig:
    overrides = [
        f"run.root={tmp}", "run.name=ray", f"run.ray_address={ray_address}", "run.ready_timeout_s=240",
        "run.placement=[{role: data-manager}, {role: env-server, launcher: ray, resources: {envs: 1}, max_restarts: 2},"
        " {role: rollout, launcher: ray, resources: {rollout: 1}, max_restarts: 2}]",
        f"envs.wire={{endpoint: 'tcp://0.0.0.0:{free_port()}', allow_remote: true}}",
        f"data.wire={{endpoint: 'tcp://0.0.0.0:{free_port()}', allow_remote: true}}",
        f"weights.announce.endpoint=ipc://{tmp}/announce.sock", f"weights.serve.endpoint=ipc://{tmp}/weights.sock",
        "envs.slots=[{type: synthetic, count: 2}]",
        "tasks.suites=[{backend: synthetic, names: [click-button], train_seeds: 4, eval_seeds: 0}]",
        "data.curation.min_steps=1", "data.curation.default_max_steps=2", "data.curation.max_steps=2",
        "rollout.episodes=2", "rollout.sampling.max_tokens=16", "rollout.engine.max_model_len=4096",
    ]
    return load(RunConfig, ROOT / "configs" / "rl.yaml", overrides)


def _stored(cfg: RunConfig) -> int:
    with Client(cfg.data.wire) as client:
        return client.request(StatsRequest()).trajectories


def _watch(sup: Supervisor, done: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Run the supervisor's watch rounds until `done()`."""
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"no {what} in {timeout_s:.0f} s"
        sup.poll()
        time.sleep(0.5)


def _member(sup: Supervisor, name: str) -> Member:
    return next(m for m in sup.members if m.instance.name == name)


def _pids(member: Member) -> tuple[int, int]:
    """(the actor's process, the role's process: its guard's child)."""
    actor, guard = ray.get(member.process.actor.pids.remote(), timeout=60)
    (role,) = psutil.Process(guard).children()
    return actor, role.pid


def _node_resources() -> dict[str, dict]:
    import ray
    return {n["NodeID"]: n["Resources"] for n in ray.nodes() if n["Alive"]}


def test_an_actor_that_cannot_start_is_a_dead_role_with_rays_reason(ray_cluster, tmp_path, caplog):
    launcher = RayLauncher(ray_cluster, namespace="dart-jax-test", workdir=str(tmp_path / "elsewhere"))
    spec = RoleSpec("env-server", launcher="ray", max_restarts=0, resources={"envs": 1})
    process = launcher.start(Instance("nowhere", "env-server", tmp_path / "role.yaml", tmp_path / "role.log"), spec)
    assert process.exit_code() == 1
    assert "is not on node" in caplog.text  # Ray's reason, in the supervisor's log
    assert process.restarts() == 0
    process.stop()
    launcher.release()


def test_a_row_the_cluster_cannot_hold_is_refused_with_what_it_asked(ray_cluster, tmp_path):
    launcher = RayLauncher(ray_cluster, namespace="dart-jax-test", ready_timeout_s=5)
    spec = RoleSpec("rollout", count=2, launcher="ray", resources={"rollout": 1})  # one node holds one
    with pytest.raises(RuntimeError, match=r"Ray could not place 2 x rollout \({'rollout': 1} each, PACK\)"):
        launcher.start(Instance("rollout-0", "rollout", tmp_path / "r.yaml", tmp_path / "r.log"), spec)
    assert launcher.groups == {}


@pytest.mark.vllm
def test_roles_on_ray_serve_and_come_back_after_kills(ray_cluster, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # where `dart-jax run` runs: the roles run there too
    cfg = _config(tmp_path, ray_cluster)
    run, policy = prepare(cfg)
    cfg = with_policy(cfg, policy)
    with Supervisor(cfg, run) as sup:
        sup.start({"data-manager", "env-server"})
        sup.start({"rollout"})
        env, worker = _member(sup, "env-server"), _member(sup, "rollout")
        assert isinstance(env.process, RayProcess) and isinstance(worker.process, RayProcess)
        nodes = _node_resources()  # each actor on the node holding its row's resource, in its group
        assert "envs" in nodes[env.process.node()] and "rollout" in nodes[worker.process.node()]
        assert env.process.node() != worker.process.node()
        launcher = sup.launchers["ray"]
        assert len(launcher.groups) == 2
        assert all(ray.util.placement_group_table(pg)["state"] == "CREATED" for pg in launcher.groups.values())
        assert env.host not in (None, "0.0.0.0")  # the rollout worker reached the env server there
        role = load(RunConfig, run.root / "roles" / "rollout.yaml")
        assert [w.endpoint for w in role.rollout.env_servers] == [cfg.envs.wire.endpoint.replace("0.0.0.0", env.host)]
        assert role.data.wire.endpoint == cfg.data.wire.endpoint.replace("0.0.0.0", env.host)  # this machine's node
        _watch(sup, lambda: _stored(cfg) >= 3, 240, "3 trajectories")
        code = psutil.Process(_pids(worker)[1]).environ()["PYTHONPATH"]
        assert "runtime_resources/py_modules_files" in code  # the job's code, not a checkout on the node

        # the rollout worker's actor process dies: Ray restarts the actor, which starts the worker
        worker_actor, worker_role = _pids(worker)
        old_worker = [psutil.Process(worker_role), *psutil.Process(worker_role).children(recursive=True)]
        os.kill(worker_actor, signal.SIGKILL)
        # meanwhile the env server's role dies, its actor lives: the supervisor replaces the actor.
        # (Killed while no episode holds a slot: an env request in flight to a dead env server
        # waits out the env client's timeouts, 90 s a step, before the episode is played again.)
        env_actor, env_role = _pids(env)
        os.kill(env_role, signal.SIGKILL)
        _, alive = psutil.wait_procs(old_worker, timeout=30)
        assert not alive  # the old worker and its vLLM engine died with their actor
        before = _stored(cfg)  # from here on, only the new worker and the new env server serve
        _watch(sup, lambda: worker.process.restarts() == 1 and sup.restarts()["env-server"] == 1
               and _stored(cfg) >= before + 3, 300, "trajectories after both restarts")
        assert _pids(worker)[0] != worker_actor and _pids(env)[0] != env_actor
        assert "rollout" in _node_resources()[worker.process.node()]  # restarted in its bundle
        assert sup.restarts() == {"data-manager": 0, "env-server": 1, "rollout": 1}
        groups = list(launcher.groups.values())
    assert launcher.groups == {}  # the run released its placement groups
    assert all(ray.util.placement_group_table(pg)["state"] == "REMOVED" for pg in groups)

    acked = [json.loads(line)["traj"] for line in run.metrics_path("rollout-rollout-0").read_text().splitlines()
             if '"traj"' in line]
    assert acked and set(acked) <= set(stored_ids(run.data / "store.sqlite"))
    assert content_duplicates(run.data / "store.sqlite") == []
    roles = str(run.root / "roles")
    assert not [p for p in psutil.process_iter(["cmdline"]) if roles in " ".join(p.info["cmdline"] or [])]
