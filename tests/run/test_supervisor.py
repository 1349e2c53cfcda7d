"""The supervisor's rules, with scripted processes: restarts with backoff, giving up with a
message naming the role and its log, bad configs, silent servers, per-instance configs."""

import dataclasses

import pytest

from dart_jax.run import supervisor as sup_lib
from dart_jax.run.schema import RunConfig
from dart_jax.run.config import RunSection
from dart_jax.run.launchers.config import RoleSpec
from dart_jax.run.supervisor import RunFailed, Supervisor, instance_configs
from dart_jax.rundir import RunDir
from dart_jax.wire import Server, WireConfig
from dart_jax.wire.messages import Pong


class Scripted:
    """A process whose exit codes come from a script: None while it runs."""

    def __init__(self, codes):
        self.codes, self.killed, self.stopped = list(codes), False, False

    def exit_code(self):
        return self.codes.pop(0) if len(self.codes) > 1 else self.codes[0]

    def stop(self, grace_s=20.0):
        self.stopped = True

    def kill(self):
        self.killed = True


class Launcher:
    def __init__(self, scripts):
        self.scripts, self.started = scripts, []

    def start(self, instance, spec=None, index=0):
        self.started.append(instance.name)
        return Scripted(self.scripts[instance.name].pop(0))


def _cfg(tmp_path, *roles, max_restarts=2) -> RunConfig:
    placement = tuple(RoleSpec(r, max_restarts=max_restarts) for r in roles)
    return RunConfig(run=RunSection(name="s", root=str(tmp_path), placement=placement, heartbeat_s=0.05))


def _supervisor(tmp_path, cfg, scripts, monkeypatch) -> Supervisor:
    monkeypatch.setattr(sup_lib.time, "sleep", lambda s: None)
    return Supervisor(cfg, RunDir.create(tmp_path / "s"), {"local": Launcher(scripts)})


def test_a_dead_role_restarts_after_a_backoff_and_a_finished_trainer_ends_the_wait(tmp_path, monkeypatch):
    clock = iter(range(0, 10_000))
    monkeypatch.setattr(sup_lib.time, "monotonic", lambda: float(next(clock)))
    scripts = {"rollout": [[None, None, -9], [None]], "trainer": [[None, None, None, None, None, None, 0]]}
    sup = _supervisor(tmp_path, _cfg(tmp_path, "rollout", "trainer"), scripts, monkeypatch)
    sup.start({"rollout", "trainer"})
    sup.wait_done("trainer")
    assert sup.launchers["local"].started == ["trainer", "rollout", "rollout"]
    assert sup.restarts() == {"trainer": 0, "rollout": 1}
    assert (tmp_path / "s" / "roles" / "rollout.yaml").exists()
    sup.stop({"rollout", "trainer"})  # the phase ends: the run's summary still counts its restarts
    assert sup.restarts() == {"trainer": 0, "rollout": 1}


def test_a_role_that_keeps_dying_stops_the_run_naming_it_and_its_log(tmp_path, monkeypatch):
    clock = iter(range(0, 10_000, 100))  # every backoff has passed by the next look
    monkeypatch.setattr(sup_lib.time, "monotonic", lambda: float(next(clock)))
    scripts = {"rollout": [[1], [1], [1]], "trainer": [[None]]}
    sup = _supervisor(tmp_path, _cfg(tmp_path, "rollout", "trainer", max_restarts=2), scripts, monkeypatch)
    sup.start({"rollout", "trainer"})
    with pytest.raises(RunFailed, match=r"rollout died 3 times \(last exit code 1\).*logs/rollout.out.log"):
        for _ in range(20):
            sup.poll()


def test_a_refused_config_stops_the_run_at_once(tmp_path, monkeypatch):
    sup = _supervisor(tmp_path, _cfg(tmp_path, "trainer"), {"trainer": [[2]]}, monkeypatch)
    sup.start({"trainer"})
    with pytest.raises(RunFailed, match="trainer refused its config"):
        sup.poll()


def test_a_server_that_stops_answering_is_killed(tmp_path, monkeypatch):
    wire = WireConfig(endpoint=f"ipc://{tmp_path}/dm.sock")
    server = Server(wire, lambda m: Pong(role="x", pid=0, uptime_s=0.0), role="data-manager").start()
    cfg = dataclasses.replace(_cfg(tmp_path, "data-manager"), data=dataclasses.replace(RunConfig().data, wire=wire))
    sup = _supervisor(tmp_path, cfg, {"data-manager": [[None]]}, monkeypatch)
    sup.start({"data-manager"})  # answers Ping: ready
    server.stop()  # alive but silent from now on
    member = sup.members[0]
    for _ in range(sup_lib.MISSES):
        sup._last_ping = -1e9
        sup.poll()
    assert member.process.killed


def test_a_restarted_server_is_given_its_start_up_time_before_missed_pings_count(tmp_path, monkeypatch):
    wire = WireConfig(endpoint=f"ipc://{tmp_path}/dm.sock")
    server = Server(wire, lambda m: Pong(role="x", pid=0, uptime_s=0.0), role="data-manager").start()
    cfg = dataclasses.replace(_cfg(tmp_path, "data-manager"), data=dataclasses.replace(RunConfig().data, wire=wire))
    cfg = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, ready_timeout_s=60.0))
    sup = _supervisor(tmp_path, cfg, {"data-manager": [[None], [None]]}, monkeypatch)
    sup.start({"data-manager"})
    server.stop()
    member = sup.members[0]
    sup._launch(member)  # as after a death: starting, not answering yet (imports, the store's recovery)
    for _ in range(2 * sup_lib.MISSES):
        sup._last_ping = -1e9
        sup.poll()
    assert not member.process.killed and member.misses == 0
    member.started_at -= 61.0  # past run.ready_timeout_s without one answer
    sup._last_ping = -1e9
    sup.poll()
    assert member.process.killed


def test_instances_get_their_own_endpoints_and_ids():
    cfg = RunConfig(run=RunSection(placement=(RoleSpec("env-server", count=3), RoleSpec("rollout", count=2))))
    envs = instance_configs(cfg, "env-server", 3)
    assert [c.envs.wire.endpoint for c in envs] == ["tcp://127.0.0.1:5555", "tcp://127.0.0.1:5556",
                                                      "tcp://127.0.0.1:5557"]
    workers = instance_configs(cfg, "rollout", 2)
    assert [c.rollout.worker_id for c in workers] == ["rollout-0", "rollout-1"]
    assert [w.endpoint for w in workers[1].rollout.env_servers] == [c.envs.wire.endpoint for c in envs]


def test_an_env_server_on_all_interfaces_is_reached_at_its_node():
    cfg = RunConfig(run=RunSection(placement=(RoleSpec("env-server"), RoleSpec("rollout"))))
    cfg = dataclasses.replace(cfg, envs=dataclasses.replace(cfg.envs, wire=WireConfig(
        endpoint="tcp://0.0.0.0:7000", allow_remote=True)))
    (worker,) = instance_configs(cfg, "rollout", 1, hosts={"tcp://0.0.0.0:7000": "10.1.2.3"})
    assert [w.endpoint for w in worker.rollout.env_servers] == ["tcp://10.1.2.3:7000"]


class OnNode(Scripted):
    """A cluster launcher's process: on a node of its own, restarted by the cluster too."""

    def __init__(self, codes, host="127.0.0.2", restarts=0):
        super().__init__(codes)
        self._host, self._restarts = host, restarts

    def host(self):
        return self._host

    def restarts(self):
        return self._restarts


class ClusterLauncher(Launcher):
    def start(self, instance, spec=None, index=0):
        self.started.append(instance.name)
        return OnNode(**self.scripts[instance.name].pop(0))


def test_a_replaced_process_keeps_the_restarts_its_cluster_made(tmp_path, monkeypatch):
    clock = iter(range(0, 10_000, 100))
    monkeypatch.setattr(sup_lib.time, "monotonic", lambda: float(next(clock)))
    scripts = {"rollout": [{"codes": [None, -9], "restarts": 2}, {"codes": [None], "restarts": 1}]}
    cfg = _cfg(tmp_path, "rollout")
    monkeypatch.setattr(sup_lib.time, "sleep", lambda s: None)
    sup = Supervisor(cfg, RunDir.create(tmp_path / "s"), {"local": ClusterLauncher(scripts)})
    sup.start({"rollout"})
    for _ in range(3):
        sup.poll()
    assert sup.launchers["local"].started == ["rollout", "rollout"]
    assert sup.restarts() == {"rollout": 1 + 2 + 1}  # the supervisor's, the old actor's, the new one's


def test_an_env_server_on_all_interfaces_is_pinged_at_its_node(tmp_path, monkeypatch):
    from tests.net import free_port
    port = free_port()
    at_node = WireConfig(endpoint=f"tcp://127.0.0.2:{port}")  # reachable there, not at 0.0.0.0 (127.0.0.1)
    server = Server(at_node, lambda m: Pong(role="env-server", pid=0, uptime_s=0.0), role="env-server").start()
    try:
        cfg = _cfg(tmp_path, "env-server", "rollout")
        cfg = dataclasses.replace(cfg, envs=dataclasses.replace(cfg.envs, wire=WireConfig(
            endpoint=f"tcp://0.0.0.0:{port}", allow_remote=True)))
        cfg = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, ready_timeout_s=5.0))
        scripts = {"env-server": [{"codes": [None]}], "rollout": [{"codes": [None]}]}
        monkeypatch.setattr(sup_lib.time, "sleep", lambda s: None)
        sup = Supervisor(cfg, RunDir.create(tmp_path / "s"), {"local": ClusterLauncher(scripts)})
        sup.start({"env-server", "rollout"})  # ready: it answered at 127.0.0.2
    finally:
        server.stop()
    worker = (tmp_path / "s" / "roles" / "rollout.yaml").read_text()
    assert f"tcp://127.0.0.2:{port}" in worker
