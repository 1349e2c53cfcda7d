"""`dart-jax tpu submit|status|logs|stop|delete CONFIG`: the trainer on a Cloud TPU slice, with gcloud.

    dart-jax tpu submit configs/tpu/v5p-64.yaml tpu.project=my-project --dry-run   # the commands
    dart-jax tpu submit configs/tpu/v5p-64.yaml tpu.project=my-project             # run them
    dart-jax tpu status configs/tpu/v5p-64.yaml tpu.project=my-project             # state, and what submit does
    dart-jax tpu logs configs/tpu/v5p-64.yaml tpu.project=my-project               # follow again
    dart-jax tpu delete configs/tpu/v5p-64.yaml tpu.project=my-project

`submit` builds a wheel of this checkout and writes the run config, the lock and the install
and launch scripts beside it (dart_jax.run.launchers.remote); looks the queued resource up
(one SUSPENDED by a preemption, or FAILED, is deleted and created again; an existing one is
reused) and creates it (`gcloud compute tpus queued-resources create`), polls `describe` until
ACTIVE, copies those files to every worker (`tpu-vm scp --worker=all`), installs (`tpu-vm ssh
--worker=all --command ...`: uv, its Python, the wheel), starts the same program on every host
(`dart-jax train run.yaml`, detached, output in train.log; a trainer started before is stopped
first, and the new one resumes from the run's last checkpoint) and follows worker 0's log
until interrupted; the job keeps running. On Cloud TPU `jax.distributed.initialize()` finds
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
from dart_jax.run.launchers import remote
from dart_jax.run.launchers.config import TPUConfig

FAILED_STATES = ("FAILED", "SUSPENDING", "SUSPENDED")
REPLACED_STATES = ("FAILED", "SUSPENDED")  # submit deletes these and creates the slice again
# what `status` adds to a state (the queued resource states of the Cloud TPU API)
STATE_NOTES = {
    None: "no such queued resource: `dart-jax tpu submit` creates it",
    "ACTIVE": "the slice is up: `dart-jax tpu submit` installs and launches again on it (the trainer resumes)",
    "SUSPENDED": "preempted or stopped: `dart-jax tpu submit` deletes it and creates it again (the trainer "
                 "resumes from its last checkpoint)",
    "FAILED": "it could not be provisioned: `dart-jax tpu submit` deletes it and creates it again",
    "SUSPENDING": "being preempted: wait until SUSPENDED, then `dart-jax tpu submit`",
    "DELETING": "being deleted: `dart-jax tpu submit` once it is gone",
}
AUTH_ARGV = ("gcloud", "auth", "list", "--filter=status:ACTIVE", "--format=value(account)", "--quiet")
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
    """Where, and --quiet: gcloud never prompts (a first ssh would ask for a key passphrase)."""
    return [f"--zone={t.zone}", f"--project={t.project}", "--quiet"]


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
    """--force deletes the slice's TPU VMs first (--quiet, from _where, answers the confirmation)."""
    return ["gcloud", "compute", "tpus", "queued-resources", "delete", t.queued_resource_id, *_where(t), "--force"]


def ssh_argv(t: TPUConfig, command: str, worker: str = "all") -> list[str]:
    argv = ["gcloud", "compute", "tpus", "tpu-vm", "ssh", t.name, *_where(t), f"--worker={worker}",
            f"--command={command}"]
    return argv + (["--internal-ip"] if t.internal_ips else [])


def scp_argv(t: TPUConfig, local: Sequence[Path], dest: str) -> list[str]:
    argv = ["gcloud", "compute", "tpus", "tpu-vm", "scp", *map(str, local), f"{t.name}:{dest}", *_where(t),
            "--worker=all", "--recurse"]  # the keys directory
    return argv + (["--internal-ip"] if t.internal_ips else [])


def remote_command(t: TPUConfig, script: str, *args: str) -> str:
    """`bash WORKDIR/SCRIPT ARGS`: the script cds into its own directory."""
    return shlex.join(["bash", f"{t.workdir}/{script}", *args])


def logs_command(t: TPUConfig) -> str:
    return f"tail -n +1 -F {shlex.quote(f'{t.workdir}/{remote.LOG}')}"


@dataclasses.dataclass(frozen=True)
class Command:
    """One command of a sequence: `poll` repeats it until ACTIVE, `follow` streams until ^C,
    `ship` builds the wheel here and writes what travels beside it."""
    note: str
    argv: tuple[str, ...]
    kind: Literal["run", "poll", "follow", "ship"] = "run"


def submit_commands(t: TPUConfig, ship_dir: Path, state: str | None = None) -> list[Command]:
    """Every command of `submit`, given the queued resource's present `state` (None: absent):
    SUSPENDED (a preempted spot slice) or FAILED is deleted and created again; one that exists
    otherwise is reused, and the job is installed and launched on it again (it resumes)."""
    wheel = remote.wheel_name()
    files = [ship_dir / n for n in (wheel, remote.LOCK, remote.INSTALL, remote.LAUNCH, remote.CONFIG, remote.KEYS)]
    commands = [Command(f"build the wheel of this checkout into {ship_dir}, beside the lock, the run config "
                        "and the install and launch scripts", tuple(remote.wheel_argv(ship_dir)), "ship")]
    if state in REPLACED_STATES:
        commands.append(Command(f"the queued resource is {state}: delete it, then create it again",
                                tuple(delete_argv(t))))
    if state is None or state in REPLACED_STATES:
        commands.append(Command(f"create the queued resource ({t.accelerator_type}, {t.provisioning})",
                                tuple(create_argv(t))))
    return commands + [
        Command(f"every {t.poll_s:g} s until ACTIVE (at most {t.active_timeout_s:g} s)",
                tuple(describe_argv(t, state_only=True)), "poll"),
        Command("make the work directory on every worker", tuple(ssh_argv(t, shlex.join(["mkdir", "-p", t.workdir])))),
        Command("copy the wheel, the lock, the scripts, the run config and its CURVE keys to every worker",
                tuple(scp_argv(t, files, f"{t.workdir}/"))),
        Command(f"install on every worker (uv, Python {t.python}, the wheel with [{t.extras}]"
                f"{', the shared root' if t.shared_root.kind != 'none' else ''})",
                tuple(ssh_argv(t, remote_command(t, remote.INSTALL)))),
        Command("start the trainer on every host (the same program everywhere; a trainer this script "
                "started before is stopped first)", tuple(ssh_argv(t, remote_command(t, remote.LAUNCH, "start")))),
        Command("follow worker 0's log (^C stops following, not the job)",
                tuple(ssh_argv(t, logs_command(t), worker="0")), "follow")]


def render_commands(commands: Sequence[Command], header: str = "") -> str:
    body = "\n".join(f"# {i}. {s.note}\n{shlex.join(s.argv)}" for i, s in enumerate(commands, 1))
    return f"# {header}\n{body}" if header else body


def commands_for(action: str, t: TPUConfig, ship_dir: Path, state: str | None = None) -> list[Command]:
    if action == "submit":
        return submit_commands(t, ship_dir, state)
    if action == "status":
        return [Command("the queued resource, its state and its node", tuple(describe_argv(t)))]
    if action == "logs":
        return [Command("follow worker 0's log (^C stops following, not the job)",
                        tuple(ssh_argv(t, logs_command(t), worker="0")), "follow")]
    if action == "stop":
        return [Command("stop the trainer on every host",
                        tuple(ssh_argv(t, remote_command(t, remote.LAUNCH, "stop"))))]
    if action == "delete":
        return [Command("delete the TPU VMs and the queued resource", tuple(delete_argv(t)))]
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


def describe_state(t: TPUConfig, env: Env) -> str | None:
    """The queued resource's state, or None when gcloud finds none."""
    got = env.runner(describe_argv(t, state_only=True), True)
    return got.stdout.strip() or None if got.returncode == 0 else None


def perform(command: Command, t: TPUConfig, env: Env, config_yaml: str = "") -> None:
    if command.kind == "poll":
        return wait_active(t, command.argv, env)
    if command.kind == "ship":
        ship_dir = Path(command.argv[command.argv.index("--wheel-dir") + 1])
        remote.ship(t, ship_dir, config_yaml, lambda argv: env.runner(argv, False).returncode)
        return None
    try:
        rc = env.runner(command.argv, False).returncode
    except KeyboardInterrupt:
        if command.kind != "follow":
            raise
        env.echo("stopped following; the job keeps running (`dart-jax tpu logs CONFIG` follows it again)")
        return None
    if rc:
        raise TPUCommandError(f"{command.note}: `{shlex.join(command.argv[:5])} ...` exited {rc}")
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


def ship_dir(cfg) -> Path:
    """Where submit writes what travels, on the machine it runs on (run.root may be a mount
    this machine lacks): .dart-jax/tpu/<run name> in the current directory."""
    return Path(".dart-jax") / "tpu" / cfg.run.name


def main(action: str, cfg, source: str, config_yaml: str, *, dry_run: bool = False, env: Env = Env()) -> int:
    """Run (or with `dry_run`, print) `action`'s commands for the run config `cfg`. A dry run
    of submit or status asks gcloud (read-only) for the queued resource's state when gcloud is
    there and signed in, and otherwise shows the commands for a slice that does not exist."""
    require(cfg.tpu, source)
    state, known = None, False
    if action in ("submit", "status"):
        try:
            check_gcloud(env)
            state, known = describe_state(cfg.tpu, env), True
        except GcloudUnavailable:
            if not dry_run:
                raise
    elif not dry_run:
        check_gcloud(env)
    commands = commands_for(action, cfg.tpu, ship_dir(cfg), state)
    header = f"queued resource {cfg.tpu.queued_resource_id}: {state or 'none'}" + \
        ("" if known else " (gcloud unavailable: assumed)") if action in ("submit", "status") else ""
    if dry_run:
        env.echo(render_commands(commands, header))
        return 0
    if action == "status":
        env.echo(f"queued resource {cfg.tpu.queued_resource_id}: {state or 'none'}: "
                 f"{STATE_NOTES.get(state, 'in progress: `dart-jax tpu submit` waits until it is ACTIVE')}")
        if state is None:
            return 0
    for command in commands:
        perform(command, cfg.tpu, env, config_yaml)
    return 0
