"""The trainer on a Cloud TPU slice as a role of `dart-jax run` (placement `launcher: tpu`).

    launcher = SliceLauncher(cfg)                  # cfg.tpu: the slice; cfg.data.wire: the data manager
    proc = launcher.start(instance)                # submit (ship, create or reuse, install, launch) ...
    proc.exit_code()                               # ... or, with tpu.attach, join a trainer submitted before

The supervisor cannot wait on a process on other hosts, so it watches the trainer's
heartbeats through the data manager (dart_jax.train.heartbeat -> TrainerStatus): running
while they come, exit code 0 when the last one says finished, 1 when it says failed or when
they stop for `tpu.heartbeat_timeout_s` (or never start within `tpu.startup_timeout_s`). A host
whose trainer exits non-zero says so sooner: its launch writes the exit code on the shared root
(remote.exit_dir), and that code is the trainer's (2, a refused config, is never restarted).
A dead trainer is then handled as any role: the supervisor starts it again (a submit: the
slice is reused, or recreated when it was preempted, and the trainer resumes from the shared
checkpoint) up to the row's `max_restarts`, and stopping the run stops the trainer on every
host (`launch.sh stop`); when the run ends, the queued resource it submitted is deleted (it bills
while it exists) unless `tpu.keep`. Rollout workers reach the weights process 0 serves at worker 0's
address (`host`). The slice reads the trainer's config with its own policy path (slice_config).
"""

from __future__ import annotations

import dataclasses
import logging
import shlex
import time
from pathlib import Path, PurePosixPath

from dart_jax.config import dump, load
from dart_jax.run.launchers import remote, tpu
from dart_jax.run.launchers.local import Instance
from dart_jax.wire import Client, RemoteError, WireTimeout
from dart_jax.wire.messages import TrainerStatus, TrainerStatusRequest

log = logging.getLogger(__name__)


def worker0_argv(t) -> list[str]:
    return ["gcloud", "compute", "tpus", "tpu-vm", "describe", t.name, f"--zone={t.zone}", f"--project={t.project}",
            "--quiet", "--format=value(networkEndpoints[0].ipAddress)"]


def slice_config(cfg, config: Path) -> str:
    """The trainer's config (`config`, as the head wrote it) as the slice reads it: a policy on
    the shared root keeps its path (the same on every host); any other is the head's own copy,
    and the slice takes the run config's `policy.hf_dir` (relative: in tpu.workdir, where the
    install's setup_command puts it)."""
    trainer = load(type(cfg), config)
    root, hf_dir = cfg.tpu.shared_root, trainer.policy.hf_dir
    if root.kind == "none" or not PurePosixPath(hf_dir).is_relative_to(root.path):
        trainer = dataclasses.replace(trainer, policy=dataclasses.replace(trainer.policy, hf_dir=cfg.policy.hf_dir))
    return dump(trainer)


class SliceProcess:
    """The trainer on the slice, as the supervisor sees it through its heartbeats."""

    def __init__(self, cfg, env: tpu.Env, clock=time.monotonic):
        self.cfg, self.env, self.clock = cfg, env, clock
        self.started = clock()

    def status(self) -> TrainerStatus | None:
        try:
            with Client(self.cfg.data.wire) as client:
                got = client.request(TrainerStatusRequest(), timeout_s=10)
        except (WireTimeout, RemoteError) as e:
            log.warning("the data manager did not say how the trainer is: %s", e)
            return None
        return got if isinstance(got, TrainerStatus) else None

    def exited(self) -> dict[str, int]:
        """The exit codes the slice's hosts wrote on the shared root (none without one)."""
        if self.cfg.tpu.shared_root.kind == "none" or not (exits := Path(remote.exit_dir(self.cfg.tpu))).is_dir():
            return {}
        codes = {f.name: f.read_text().strip() for f in exits.iterdir() if not f.name.endswith(".tmp")}
        return {host: int(code) for host, code in codes.items() if code.isdigit()}

    def exit_code(self) -> int | None:
        if failed := {host: code for host, code in self.exited().items() if code}:
            log.error("the trainer on %s exited: %s", self.cfg.tpu.name, failed)
            return 2 if 2 in failed.values() else next(iter(failed.values()))
        t, status, waited = self.cfg.tpu, self.status(), self.clock() - self.started
        fresh = status is not None and status.seen_s_ago is not None and status.seen_s_ago < waited
        if fresh and status.state in ("finished", "failed"):
            return 0 if status.state == "finished" else 1
        if fresh and status.seen_s_ago <= t.heartbeat_timeout_s:
            return None
        if not fresh and waited <= t.startup_timeout_s:
            return None  # not beating yet: installing, downloading, compiling
        log.error("the trainer on %s is silent (%s): it is taken for dead", t.name,
                  f"last heartbeat {status.seen_s_ago:.0f} s ago" if fresh else f"none in {waited:.0f} s")
        return 1

    def host(self) -> str:
        got = self.env.runner(worker0_argv(self.cfg.tpu), True)
        if got.returncode or not got.stdout.strip():
            argv = shlex.join(worker0_argv(self.cfg.tpu)[:6])
            raise tpu.TPUCommandError(f"`{argv} ...` gave no address for worker 0")
        return got.stdout.strip()

    def stop(self, grace_s: float = 20.0) -> int | None:
        if not self.cfg.tpu.attach:
            for command in tpu.commands_for("stop", self.cfg.tpu, tpu.ship_dir(self.cfg)):
                tpu.perform(command, self.cfg.tpu, self.env)
        return None

    def kill(self) -> None:
        self.stop()


class SliceLauncher:
    """Submits (or attaches to) the trainer of `cfg.tpu`; the run's other roles stay where they are."""

    def __init__(self, cfg, env: tpu.Env = tpu.Env()):
        self.cfg, self.env = cfg, env

    def start(self, instance: Instance, spec=None, index: int = 0) -> SliceProcess:
        """`instance.config` (the trainer's resolved config) travels as the slice's run.yaml."""
        t = self.cfg.tpu
        tpu.require(t, str(instance.config))
        tpu.check_gcloud(self.env)
        if not t.attach:
            if t.shared_root.kind != "none":  # exit codes of an earlier launch are not this one's
                for old in Path(remote.exit_dir(t)).glob("*"):
                    old.unlink()
            state, config_yaml = tpu.describe_state(t, self.env), slice_config(self.cfg, instance.config)
            for command in tpu.submit_commands(t, tpu.ship_dir(self.cfg), state)[:-1]:  # all but following the log
                tpu.perform(command, t, self.env, config_yaml)
            log.info("trainer submitted to %s (%s)", t.name, t.accelerator_type)
        return SliceProcess(self.cfg, self.env)

    def release(self) -> None:
        """The run is over: delete the queued resource, unless tpu.keep or attached (a trainer
        submitted by hand, on the user's slice). A failed delete is logged: the run's own
        outcome stands, and `dart-jax tpu delete` can try again."""
        t = self.cfg.tpu
        if t.attach or t.keep:
            return
        try:
            for command in tpu.commands_for("delete", t, tpu.ship_dir(self.cfg)):
                tpu.perform(command, t, self.env)
        except tpu.TPUCommandError as e:
            log.error("the queued resource %s may still exist (`dart-jax tpu delete`): %s", t.queued_resource_id, e)

