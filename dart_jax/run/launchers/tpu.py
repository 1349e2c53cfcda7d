"""`dart-jax tpu submit|status|logs|delete CONFIG`: the trainer on a Cloud TPU slice, with gcloud.

    dart-jax tpu submit configs/tpu/v5p-64.yaml tpu.project=my-project --dry-run   # the commands
    dart-jax tpu submit configs/tpu/v5p-64.yaml tpu.project=my-project             # run them
    dart-jax tpu logs configs/tpu/v5p-64.yaml tpu.project=my-project               # follow again
    dart-jax tpu delete configs/tpu/v5p-64.yaml tpu.project=my-project

`submit` creates a queued resource (`gcloud compute tpus queued-resources create`), polls
`describe` until its state is ACTIVE, installs dart-jax on every worker (`gcloud compute tpus
tpu-vm ssh NAME --worker=all --command ...`), copies the resolved run config to every worker
(`tpu-vm scp --worker=all`), starts the same program on every host (`dart-jax train run.yaml`,
detached, output in train.log) and follows worker 0's log until interrupted; the job keeps
running. Every host runs the same program: on Cloud TPU `jax.distributed.initialize()` finds
the coordinator and the process ids in the TPU metadata, so no address travels.

Commands are argument lists (never shell strings pasted together); the remote command of
`--command` is one string whose parts are quoted with shlex. Every command goes through one
runner function, so tests substitute a fake one.
"""

from __future__ import annotations

import dataclasses
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

from dart_jax.capacity.chips import parse_accelerator_type
from dart_jax.config import ConfigError, UsageError
from dart_jax.run.launchers.config import TPUConfig

REMOTE_CONFIG = "run.yaml"  # the resolved run config, in tpu.workdir on every worker
REMOTE_LOG = "train.log"  # the trainer's stdout and stderr, beside it
FAILED_STATES = ("FAILED", "SUSPENDING", "SUSPENDED")
AUTH_ARGV = ("gcloud", "auth", "list", "--filter=status:ACTIVE", "--format=value(account)")
# GA `queued-resources create` takes --spot and --reserved; --best-effort is alpha only.
PROVISIONING_FLAGS = {"on-demand": (), "spot": ("--spot",), "reserved": ("--reserved",),
                      "best-effort": ("--best-effort",)}


REQUIRED = ("project", "zone", "name", "accelerator_type", "runtime_version")


class GcloudUnavailable(UsageError):
    """gcloud is missing or has no active account: one line for the user, exit code 2."""


class TPUCommandError(RuntimeError):
    """A gcloud command failed or the slice never became ACTIVE."""


@dataclasses.dataclass(frozen=True)
class Completed:
    returncode: int
    stdout: str = ""


Runner = Callable[[Sequence[str], bool], Completed]


def run_command(argv: Sequence[str], capture: bool) -> Completed:
    """Run one command; `capture` keeps its stdout (else it goes to the terminal)."""
    proc = subprocess.run(list(argv), capture_output=capture, text=True, check=False)
    return Completed(proc.returncode, proc.stdout if capture else "")


# ---- commands ---------------------------------------------------------------------------

def _where(t: TPUConfig) -> list[str]:
    return [f"--zone={t.zone}", f"--project={t.project}"]


def create_argv(t: TPUConfig) -> list[str]:
    """`queued-resources create` (gcloud alpha for best-effort, the one tier GA lacks)."""
    track = ["gcloud", "alpha"] if t.provisioning == "best-effort" else ["gcloud"]
    argv = [*track, "compute", "tpus", "queued-resources", "create", t.queued_resource_id,
            f"--node-id={t.name}", *_where(t), f"--accelerator-type={t.accelerator_type}",
            f"--runtime-version={t.runtime_version}", *PROVISIONING_FLAGS[t.provisioning]]
    optional = {"--network": t.network, "--subnetwork": t.subnetwork, "--service-account": t.service_account,
                "--valid-until-duration": t.valid_until_duration}
    argv += [f"{flag}={value}" for flag, value in optional.items() if value]
    return argv + (["--internal-ips"] if t.internal_ips else [])


def describe_argv(t: TPUConfig, state_only: bool = False) -> list[str]:
    argv = ["gcloud", "compute", "tpus", "queued-resources", "describe", t.queued_resource_id, *_where(t)]
    return argv + (["--format=value(state.state)"] if state_only else [])


def delete_argv(t: TPUConfig) -> list[str]:
    """--force deletes the slice's TPU VMs first; --quiet answers gcloud's confirmation."""
    return ["gcloud", "compute", "tpus", "queued-resources", "delete", t.queued_resource_id, *_where(t),
            "--force", "--quiet"]


def ssh_argv(t: TPUConfig, command: str, worker: str = "all") -> list[str]:
    argv = ["gcloud", "compute", "tpus", "tpu-vm", "ssh", t.name, *_where(t), f"--worker={worker}",
            f"--command={command}"]
    return argv + (["--internal-ip"] if t.internal_ips else [])


def scp_argv(t: TPUConfig, local: Path, remote: str) -> list[str]:
    argv = ["gcloud", "compute", "tpus", "tpu-vm", "scp", str(local), f"{t.name}:{remote}", *_where(t),
            "--worker=all"]
    return argv + (["--internal-ip"] if t.internal_ips else [])


def install_command(t: TPUConfig) -> str:
    """Runs in the workdir, so relative paths in install_command and the run config agree."""
    return f"mkdir -p {shlex.quote(t.workdir)} && cd {shlex.quote(t.workdir)} && {t.install_command}"


def launch_command(t: TPUConfig) -> str:
    """Detached (setsid nohup, no terminal) so the job outlives the ssh session."""
    return (f"cd {shlex.quote(t.workdir)} && setsid nohup {t.launch_command} {REMOTE_CONFIG} "
            f"> {REMOTE_LOG} 2>&1 < /dev/null &")


def logs_command(t: TPUConfig) -> str:
    return f"tail -n +1 -F {shlex.quote(f'{t.workdir}/{REMOTE_LOG}')}"


@dataclasses.dataclass(frozen=True)
class Step:
    """One command of a sequence: `poll` repeats it until ACTIVE, `follow` streams until ^C."""
    note: str
    argv: tuple[str, ...]
    kind: Literal["run", "poll", "follow"] = "run"


def submit_steps(t: TPUConfig, local_config: Path) -> list[Step]:
    remote = f"{t.workdir}/{REMOTE_CONFIG}"
    return [Step(f"create the queued resource ({t.accelerator_type}, {t.provisioning})", tuple(create_argv(t))),
            Step(f"every {t.poll_s:g} s until ACTIVE (at most {t.active_timeout_s:g} s)",
                 tuple(describe_argv(t, state_only=True)), "poll"),
            Step("install dart-jax on every worker", tuple(ssh_argv(t, install_command(t)))),
            Step(f"copy the resolved run config (written to {local_config}) to every worker",
                 tuple(scp_argv(t, local_config, remote))),
            Step("start the trainer on every host (the same program everywhere)",
                 tuple(ssh_argv(t, launch_command(t)))),
            Step("follow worker 0's log (^C stops following, not the job)",
                 tuple(ssh_argv(t, logs_command(t), worker="0")), "follow")]


def render_steps(steps: Sequence[Step]) -> str:
    return "\n".join(f"# {i}. {s.note}\n{shlex.join(s.argv)}" for i, s in enumerate(steps, 1))


def steps_for(action: str, t: TPUConfig, local_config: Path) -> list[Step]:
    if action == "submit":
        return submit_steps(t, local_config)
    if action == "status":
        return [Step("the queued resource, its state and its node", tuple(describe_argv(t)))]
    if action == "logs":
        return [Step("follow worker 0's log (^C stops following, not the job)",
                     tuple(ssh_argv(t, logs_command(t), worker="0")), "follow")]
    if action == "delete":
        return [Step("delete the TPU VMs and the queued resource", tuple(delete_argv(t)))]
    raise ValueError(f"unknown tpu action {action!r}")


# ---- running them -----------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Env:
    """What the commands touch outside this process; tests replace each part."""
    runner: Runner = run_command
    which: Callable[[str], str | None] = shutil.which
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    echo: Callable[[str], None] = print


def check_gcloud(env: Env) -> None:
    if env.which("gcloud") is None:
        raise GcloudUnavailable("gcloud is not on PATH: install the Google Cloud CLI "
                                "(https://cloud.google.com/sdk/docs/install)")
    got = env.runner(AUTH_ARGV, True)
    if got.returncode != 0 or not got.stdout.strip():
        raise GcloudUnavailable("gcloud has no active account: run `gcloud auth login` "
                                "(or `gcloud auth activate-service-account`)")


def wait_active(t: TPUConfig, argv: Sequence[str], env: Env) -> None:
    """Poll `describe` until ACTIVE; a failed state or the deadline raises."""
    qr, deadline, last = t.queued_resource_id, env.clock() + t.active_timeout_s, None
    while True:
        got = env.runner(argv, True)
        if got.returncode:
            raise TPUCommandError(f"describing queued resource {qr} failed (exit {got.returncode})")
        state = got.stdout.strip()
        if state == "ACTIVE":
            return
        if state in FAILED_STATES:
            raise TPUCommandError(f"queued resource {qr} is {state}: `dart-jax tpu status` says why, "
                                  "`dart-jax tpu delete` removes it")
        if env.clock() >= deadline:
            raise TPUCommandError(f"queued resource {qr} is still {state} after {t.active_timeout_s:g} s; "
                                  "it stays queued until `dart-jax tpu delete`")
        if state != last:
            env.echo(f"queued resource {qr}: {state}")
        last = state
        env.sleep(t.poll_s)


def run_step(step: Step, t: TPUConfig, env: Env) -> None:
    if step.kind == "poll":
        return wait_active(t, step.argv, env)
    try:
        rc = env.runner(step.argv, False).returncode
    except KeyboardInterrupt:
        if step.kind != "follow":
            raise
        env.echo("stopped following; the job keeps running (`dart-jax tpu logs CONFIG` follows it again)")
        return None
    if rc:
        raise TPUCommandError(f"{step.note}: `{shlex.join(step.argv[:5])} ...` exited {rc}")
    return None


def require(t: TPUConfig, source: str) -> None:
    for key in REQUIRED:
        if not getattr(t, key):
            raise ConfigError(source, f"tpu.{key}", "required by `dart-jax tpu` (set it in the config "
                                                     f"or as an override: tpu.{key}=...)")
    try:
        parse_accelerator_type(t.accelerator_type)
    except ValueError as e:
        raise ConfigError(source, "tpu.accelerator_type", str(e)) from None


def main(action: str, cfg, source: str, config_yaml: str, *, dry_run: bool = False, env: Env = Env()) -> int:
    """Run (or with `dry_run`, print) `action`'s commands for the run config `cfg`."""
    require(cfg.tpu, source)
    local_config = Path(cfg.run.root) / cfg.run.name / "tpu" / REMOTE_CONFIG
    steps = steps_for(action, cfg.tpu, local_config)
    if dry_run:
        env.echo(render_steps(steps))
        return 0
    check_gcloud(env)
    if action == "submit":
        local_config.parent.mkdir(parents=True, exist_ok=True)
        local_config.write_text(config_yaml)
    for step in steps:
        run_step(step, cfg.tpu, env)
    return 0
