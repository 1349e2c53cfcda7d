"""`dart-jax run` with the trainer on a TPU slice (placement `launcher: tpu`): submitted or
attached through gcloud (a fake one here), watched through the trainer's heartbeats to a real
data manager, finished, failed or silent as those say, and stopped on every host with the run.
"""

import dataclasses
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dart_jax.config import dump, from_dict, load
from dart_jax.run.schema import RunConfig
from dart_jax.rundir import RunDir
from dart_jax.run.launchers import slice as slice_lib
from dart_jax.run.launchers import remote, tpu
from dart_jax.run.launchers.local import Instance
from dart_jax.run.supervisor import RunFailed, Supervisor, instance_configs
from dart_jax.train.heartbeat import Heartbeat
from dart_jax.wire import Client
from dart_jax.wire.messages import TrainerHeartbeat, TrainerStatusRequest
from tests.run.launchers.test_tpu import FakeGcloud
from tests.train import dm_store

WORKER0 = "10.1.2.3"


class Slice(FakeGcloud):
    """The fake gcloud, and worker 0's address from `tpu-vm describe`."""

    def __call__(self, argv, capture):
        if argv[3:5] == ["tpu-vm", "describe"]:
            self.calls.append((list(argv), capture))
            return tpu.Completed(0, WORKER0 + "\n")
        return super().__call__(argv, capture)


@pytest.fixture
def data_manager(tmp_path):
    dm_store.fill(tmp_path / "store", n=0)
    dm, stop = dm_store.serve_copy(tmp_path / "store", tmp_path / "dm")
    yield dm
    stop.set()


def _cfg(tmp_path, dm, **tpu) -> RunConfig:
    return from_dict(RunConfig, {
        "run": {"name": "slice", "root": str(tmp_path), "heartbeat_s": 0.1, "placement": [
            {"role": "trainer", "launcher": "tpu", "max_restarts": 0}]},
        "data": {"wire": {"endpoint": dm.wire.endpoint}},
        "weights": {"announce": {"endpoint": "tcp://0.0.0.0:5560", "allow_remote": True},
                    "serve": {"endpoint": "tcp://0.0.0.0:5561", "allow_remote": True}},
        "tpu": {"project": "p", "zone": "z", "name": "n", "accelerator_type": "v6e-4",
                "runtime_version": "v2-alpha-tpuv6e", "poll_s": 1, **tpu}})


def _beat(cfg, state: str, step: int = 1) -> None:
    with Client(cfg.data.wire) as client:
        client.request(TrainerHeartbeat(step=step, policy_version=step, state=state))


def test_the_trainer_is_what_its_heartbeats_say(tmp_path, data_manager):
    cfg = _cfg(tmp_path, data_manager, startup_timeout_s=0.5, heartbeat_timeout_s=0.5)
    fake = Slice()
    _beat(cfg, "failed")  # a previous incarnation's last word: older than this one, so not its
    time.sleep(0.05)
    proc = slice_lib.SliceProcess(cfg, fake.env())
    assert proc.exit_code() is None  # no heartbeat of its own yet: starting
    time.sleep(0.6)
    assert proc.exit_code() == 1  # none within the startup timeout
    proc = slice_lib.SliceProcess(cfg, fake.env())
    _beat(cfg, "running")
    assert proc.exit_code() is None
    time.sleep(0.6)
    assert proc.exit_code() == 1  # silent for longer than heartbeat_timeout_s
    _beat(cfg, "running", step=2)
    assert proc.exit_code() is None
    _beat(cfg, "finished", step=3)
    assert proc.exit_code() == 0
    _beat(cfg, "failed", step=3)
    assert proc.exit_code() == 1
    assert proc.host() == WORKER0


def _with_policy(cfg: RunConfig, hf_dir: str) -> RunConfig:
    return dataclasses.replace(cfg, policy=dataclasses.replace(cfg.policy, hf_dir=hf_dir))


def test_a_policy_on_the_shared_root_keeps_its_path_on_the_slice(tmp_path, data_manager):
    cfg = _with_policy(_cfg(tmp_path, data_manager, shared_root={"kind": "nfs", "source": "10.0.0.2:/runs",
                                                                   "path": str(tmp_path)}), "UI-TARS-1.5-7B")
    config = tmp_path / "trainer.yaml"
    for policy, shipped in ((f"{tmp_path}/slice/sft/export/step-200", f"{tmp_path}/slice/sft/export/step-200"),
                            ("/home/head-user/UI-TARS-1.5-7B", "UI-TARS-1.5-7B")):
        config.write_text(dump(_with_policy(cfg, policy)))
        assert load(RunConfig, _written(tmp_path, slice_lib.slice_config(cfg, config))).policy.hf_dir == shipped


def _written(tmp_path, text: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


def test_start_submits_without_following_and_stop_stops_every_host(tmp_path, data_manager, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = _with_policy(_cfg(tmp_path, data_manager), "UI-TARS-1.5-7B")  # the install downloads it on every worker
    config = tmp_path / "trainer.yaml"  # as the head writes it: its own copy of the policy, by absolute path
    config.write_text(dump(_with_policy(cfg, "/home/head-user/UI-TARS-1.5-7B")))
    fake = Slice(existing="SUSPENDED")  # preempted: deleted and created again
    proc = slice_lib.SliceLauncher(cfg, fake.env()).start(Instance("trainer", "trainer", config, tmp_path / "t.log"))
    steps = tpu.submit_commands(cfg.tpu, tpu.ship_dir(cfg), "SUSPENDED")
    ran = [argv for argv, _ in fake.calls]
    assert [s.kind for s in steps][-1] == "follow" and list(steps[-1].argv) not in ran
    assert tpu.delete_argv(cfg.tpu) in ran and list(steps[-2].argv) in ran  # ... the launch on every host
    assert (tpu.ship_dir(cfg) / "run.yaml").read_text() == dump(cfg)  # the slice's own path to its policy
    proc.stop()
    assert fake.calls[-1] == (tpu.ssh_argv(cfg.tpu, "bash dart-jax/launch.sh stop"), False)

    attached = Slice()
    cfg = _cfg(tmp_path, data_manager, attach=True)
    slice_lib.SliceLauncher(cfg, attached.env()).start(Instance("trainer", "trainer", config, tmp_path / "t.log")).stop()
    assert attached.calls == [(list(tpu.AUTH_ARGV), True)]  # attached: nothing submitted, nothing stopped


def test_the_run_waits_on_the_slice_and_rollout_workers_reach_its_weights(tmp_path, data_manager, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = _cfg(tmp_path, data_manager)
    run = RunDir.create(tmp_path / "slice")
    with Supervisor(cfg, run, launchers={"tpu": slice_lib.SliceLauncher(cfg, Slice().env())}) as sup:
        sup.start({"trainer"})
        rollout = instance_configs(cfg, "rollout", 1, {e: h for e, h in sup.hosts.items()})[0]
        assert rollout.weights.announce.endpoint == f"tcp://{WORKER0}:5560"
        assert rollout.weights.serve.endpoint == f"tcp://{WORKER0}:5561"
        step = [0]

        def train() -> None:  # the trainer's process 0, as far as the data manager sees it
            with Heartbeat(cfg.data.wire, 0.1, lambda: (step[0], step[0])) as beat:
                for step[0] in range(1, 4):
                    time.sleep(0.2)
                beat.finish()

        trainer = threading.Thread(target=train)
        trainer.start()
        sup.wait_done("trainer", period_s=0.1)
        trainer.join()
    with Client(cfg.data.wire) as client:
        status = client.request(TrainerStatusRequest())
    assert (status.state, status.step) == ("finished", 3)


def test_a_silent_slice_stops_the_run_when_its_restarts_are_spent(tmp_path, data_manager, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = _cfg(tmp_path, data_manager, startup_timeout_s=0.3)
    run = RunDir.create(tmp_path / "slice")
    with Supervisor(cfg, run, launchers={"tpu": slice_lib.SliceLauncher(cfg, Slice().env())}) as sup:
        sup.start({"trainer"})
        with pytest.raises(RunFailed, match="trainer died 1 times"):
            sup.wait_done("trainer", period_s=0.1)


def _refusing_slice(tmp_path, dm, **tpu):
    """A slice config with its shared root in tmp_path, whose trainer refuses its config (exit 2)."""
    return _cfg(tmp_path, dm, launch_command=f"{sys.executable} -c 'import sys; sys.exit(2)'",
                shared_root={"kind": "nfs", "source": "10.0.0.2:/runs", "path": str(tmp_path)}, **tpu)


def test_a_trainer_that_exits_before_its_first_heartbeat_is_seen_in_seconds(tmp_path, data_manager):
    cfg = _refusing_slice(tmp_path, data_manager)  # startup_timeout_s: 2 h
    host = tmp_path / "host0"
    host.mkdir()
    (host / remote.LAUNCH).write_text(remote.launch_script(cfg.tpu))
    subprocess.run(["bash", remote.LAUNCH, "start"], cwd=host, check=True, timeout=60)
    proc = slice_lib.SliceProcess(cfg, Slice().env())
    deadline = time.monotonic() + 60
    while (code := proc.exit_code()) is None:
        assert time.monotonic() < deadline, "the launch wrote no exit code"
        time.sleep(0.1)
    assert code == 2
    assert list(proc.exited().values()) == [2]


def test_stop_waits_for_a_trainer_that_holds_sigterm_not_only_for_its_wrapper(tmp_path):
    """TERM ends the launch's wrapper (bash) at once; a trainer holding TERM (JAX's preemption
    notice) runs on, and a new launch beside it would meet its coordinator port and its chips."""
    holder = tmp_path / "dart-jax-holder.py"
    holder.write_text("import signal, time\nsignal.signal(signal.SIGTERM, lambda *_: None)\ntime.sleep(2)\n")
    t = dataclasses.replace(tpu.TPUConfig(), launch_command=f"{sys.executable} {holder}")
    (tmp_path / remote.LAUNCH).write_text(remote.launch_script(t))
    subprocess.run(["bash", remote.LAUNCH, "start"], cwd=tmp_path, check=True, timeout=60)
    session = int((tmp_path / remote.PID).read_text())
    time.sleep(0.5)  # the trainer has set its handler
    subprocess.run(["bash", remote.LAUNCH, "stop"], cwd=tmp_path, check=True, timeout=60)
    left = subprocess.run(["ps", "-o", "stat=,args=", "--sid", str(session)], capture_output=True, text=True).stdout
    assert not [line for line in left.splitlines() if not line.startswith("Z")], left


def test_a_refused_config_is_never_restarted_and_an_old_exit_code_is_not_this_launch(tmp_path, data_manager,
                                                                                     monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = _refusing_slice(tmp_path, data_manager)
    exits = Path(remote.exit_dir(cfg.tpu))
    exits.mkdir(parents=True)
    (exits / "old-host").write_text("137\n")  # a launch before this one
    run = RunDir.create(tmp_path / "slice")
    with Supervisor(cfg, run, launchers={"tpu": slice_lib.SliceLauncher(cfg, Slice().env())}) as sup:
        sup.start({"trainer"})
        assert not any(exits.iterdir())  # the submit cleared it
        (exits / "t1v-w-0").write_text("2\n")  # what host 0's launch writes when the trainer refuses its config
        with pytest.raises(RunFailed, match="refused its config"):
            sup.wait_done("trainer", period_s=0.1)
        assert sup.restarts() == {"trainer": 0}


@pytest.mark.parametrize("keep", [False, True])
def test_the_runs_end_deletes_the_queued_resource_it_submitted_unless_kept(tmp_path, data_manager, monkeypatch, keep):
    monkeypatch.chdir(tmp_path)
    cfg = _cfg(tmp_path, data_manager, startup_timeout_s=0.3, keep=keep)
    fake = Slice()
    with pytest.raises(RunFailed):  # a run that fails ends too
        with Supervisor(cfg, RunDir.create(tmp_path / "slice"),
                        launchers={"tpu": slice_lib.SliceLauncher(cfg, fake.env())}) as sup:
            sup.start({"trainer"})
            sup.wait_done("trainer", period_s=0.1)
    ran = [argv for argv, _ in fake.calls]
    assert (tpu.delete_argv(cfg.tpu) in ran) is not keep
    assert ran[-1] == tpu.delete_argv(cfg.tpu) or keep  # after the trainer was stopped on every host


def test_a_failed_delete_at_the_runs_end_is_logged_not_raised(tmp_path, data_manager, caplog):
    cfg = _cfg(tmp_path, data_manager)
    slice_lib.SliceLauncher(cfg, Slice(fail="queued-resources delete").env()).release()
    assert "may still exist" in caplog.text
    attached = Slice()
    slice_lib.SliceLauncher(_cfg(tmp_path, data_manager, attach=True), attached.env()).release()
    assert attached.calls == []  # a slice submitted by hand is the user's to delete
