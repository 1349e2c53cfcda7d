"""What `dart-jax tpu submit` ships to every host of a slice, and the two scripts each host runs.

    ship(tpu_cfg, ship_dir, config_yaml, runner)   # the wheel of this checkout, its lock, the scripts
    # on every worker, in tpu.workdir:
    bash install.sh        # uv, a Python >= 3.11 of uv's, .venv with the wheel and its extras
    bash launch.sh start   # stop what it started before, start `dart-jax train run.yaml` detached
    bash launch.sh stop

The scripts are rendered from the `tpu:` section and are the same text the pod rehearsal
(tests/run/launchers/test_pod_rehearsal.py) runs for two local hosts. TPU VM images run
Python 3.10 and the pinned jax needs >= 3.11, so the install brings its own interpreter: uv
from the registry, then uv's managed Python. Entry points are on PATH for the launch because
launch.sh puts the venv's bin/ first (a non-interactive ssh reads no profile). Two variables
let an install reuse what a machine already has (the rehearsal; never needed on a slice):
DART_PYTHON, an interpreter instead of uv's; DART_DEPS_FROM, a site-packages directory that
already holds the dependencies, so only the wheel is installed (--no-deps).
"""

from __future__ import annotations

import dataclasses
import getpass
import grp
import os
import shlex
import shutil
import sys
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path

import yaml

from dart_jax.config import UsageError
from dart_jax.run.launchers.config import SharedRoot, TPUConfig

CONFIG, LOG, PID = "run.yaml", "train.log", "train.pid"
EXITS = ".dart-jax-exit"  # under the shared root: <tpu name>/<host>, each host's trainer exit code
LOCK = "lock.txt"
KEYS = "keys"  # the CURVE key files the trainer uses, beside its config on every worker
# link -> the CURVE key files the trainer reads on it: a client of the data manager, the weights' server
TRAINER_KEYS = {("data", "wire"): ("server_public_key", "client_secret_key"),
                ("weights", "announce"): ("server_secret_key", "authorized_clients_dir"),
                ("weights", "serve"): ("server_secret_key", "authorized_clients_dir")}
INSTALL, LAUNCH = "install.sh", "launch.sh"
CHECKOUT = Path(__file__).resolve().parents[3]
LOCK_SOURCE = Path("requirements/lock-tpu.txt")  # the TPU hosts' lock (scripts/compile_locks.sh), as constraints


@dataclasses.dataclass(frozen=True)
class Ship:
    """The files that travel to every worker, all in one local directory."""
    directory: Path
    wheel: str  # the wheel's file name

    @property
    def files(self) -> list[Path]:
        return [self.directory / n for n in (self.wheel, LOCK, INSTALL, LAUNCH, CONFIG, KEYS)]


def wheel_name(checkout: Path = CHECKOUT) -> str:
    pyproject = checkout / "pyproject.toml"
    if not pyproject.is_file():
        raise UsageError(f"`dart-jax tpu submit` ships a checkout of dart-jax; {checkout} has no pyproject.toml")
    project = tomllib.loads(pyproject.read_text())["project"]
    return f"{project['name'].replace('-', '_')}-{project['version']}-py3-none-any.whl"


def wheel_argv(out_dir: Path, checkout: Path = CHECKOUT) -> list[str]:
    """Build the checkout's wheel with the interpreter running us (no download: setuptools is here)."""
    return [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
            "--wheel-dir", str(out_dir), str(checkout)]


APT = "sudo apt-get -o DPkg::Lock::Timeout=300"  # right after boot, the image's own updates may hold dpkg's lock


def _mount(root: SharedRoot) -> str:
    if root.kind == "none":
        return "# no shared root is mounted (tpu.shared_root.kind: none)"
    path, source = shlex.quote(root.path), shlex.quote(root.source)
    if root.kind == "nfs":
        install = f"command -v mount.nfs >/dev/null || {{ {APT} update -q && {APT} install -yq nfs-common; }}"
        mount = f"sudo mount -t nfs -o rw,hard {source} {path}"
    else:  # orbax renames a step's temporary directory when it commits: gcsfuse must allow it
        install = ("command -v gcsfuse >/dev/null || { curl -fsSL https://packages.cloud.google.com/apt/doc/apt-key.gpg"
                   " | sudo tee /usr/share/keyrings/cloud.google.asc >/dev/null && echo \"deb [signed-by=/usr/share/"
                   "keyrings/cloud.google.asc] https://packages.cloud.google.com/apt gcsfuse-$(lsb_release -cs) main\""
                   f" | sudo tee /etc/apt/sources.list.d/gcsfuse.list >/dev/null && {APT} update -q"
                   f" && {APT} install -yq gcsfuse; }}")
        mount = f"sudo gcsfuse -o allow_other --implicit-dirs --rename-dir-limit=100000 --file-mode=666 " \
                f"--dir-mode=777 {source} {path}"
    return (f"# the shared run root ({root.kind}), the same directory on every host\n{install}\n"
            f"mountpoint -q {path} || {{ sudo mkdir -p {path} && {mount}; }}\n{share_access(root)}")


def share_access(root: SharedRoot) -> str:
    """A fresh NFS share is root's, 0755, and each host's user has a uid of its own: every host's
    user joins one group of a fixed id (the head's user too) and the share is that group's,
    setgid (what is made under it keeps the group) and group-writable (the launch's umask 002
    keeps what the trainer makes so). A group rather than a world-writable sticky directory:
    the sticky bit would stop one host's user renaming or removing another's files (orbax
    commits a step by renaming, the head clears exit codes). gcsfuse mounts it all 777."""
    if root.kind != "nfs":
        return "# gcsfuse: every file and directory is writable by all (--file-mode, --dir-mode)"
    path, gid = shlex.quote(root.path), root.gid
    return (f"# every host's user writes the share through group {gid}\n"
            f"getent group {gid} >/dev/null || sudo groupadd -g {gid} dart-jax\n"
            f"sudo usermod -aG \"$(getent group {gid} | cut -d: -f1)\" \"${{USER:-$(id -un)}}\"\n"
            f"sudo chgrp {gid} {path} && sudo chmod 2775 {path}")


class ShareAccessError(UsageError):
    """The head's user cannot write the shared run root (a fresh share, or a login from before
    the user joined the share's group); the message names the command that fixes it."""


def share_command(root: SharedRoot) -> str:
    """The install's share step (share_access) as one command line a user runs on the head."""
    return " && ".join(line for line in share_access(root).splitlines() if not line.startswith("#"))


def check_share_writable(root: SharedRoot, directory: Path) -> None:
    """Refuse, naming the fix, a run directory under an NFS shared root that this process cannot
    make: the head makes the run directory before any slice host has installed (and made the
    share writable). Not done with sudo here: a group joined now counts only from the user's
    next login, so this process could not write the share anyway."""
    share = Path(root.path)
    if root.kind != "nfs" or not (directory == share or share in directory.parents):
        return
    if not share.is_dir():
        raise ShareAccessError(f"the shared root {share} is not there: mount the share at it on this host first")
    existing = next(p for p in (directory, *directory.parents) if p.exists())
    if os.access(existing, os.W_OK | os.X_OK):
        return
    user = getpass.getuser()
    if existing != share:
        raise ShareAccessError(f"{existing} is not writable by {user}: choose another run.root or run.name")
    group = next((g for g in grp.getgrall() if g.gr_gid == root.gid), None)
    if group is not None and user in group.gr_mem and root.gid not in os.getgroups():
        raise ShareAccessError(f"the shared root {share} is group {group.gr_name}'s, which {user} joined after this "
                               f"login: log in again (or run under `sg {group.gr_name}`)")
    raise ShareAccessError(f"the shared root {share} is not writable by {user}: run `{share_command(root)}` on this "
                           f"host (the slice install's share step: group {root.gid}, mode 2775), then log in again")


def install_script(t: TPUConfig, wheel: str) -> str:
    setup = "# no tpu.setup_command"
    if t.setup_command:  # the venv and uv on PATH
        setup = f"PATH=\"$PWD/.venv/bin:$(dirname \"$UV\"):$PATH\" bash -c {shlex.quote(t.setup_command)}"
    return f"""#!/usr/bin/env bash
# dart-jax on one host of the slice (written by `dart-jax tpu submit`; idempotent): run it as
# `bash {INSTALL}` in the directory it lies in, beside the wheel and its lock.
set -euo pipefail
cd "$(dirname "$0")"
{_mount(t.shared_root)}
# uv from the registry brings a Python of its own (TPU VM images have 3.10)
if command -v uv >/dev/null; then UV=$(command -v uv)
else python3 -m pip install --user --quiet "uv=={t.uv_version}"; UV="$HOME/.local/bin/uv"; fi
"$UV" venv --quiet --allow-existing --python "${{DART_PYTHON:-{t.python}}}" .venv
if [ -n "${{DART_DEPS_FROM:-}}" ]; then
  echo "$DART_DEPS_FROM" > "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/dart-deps.pth"
  "$UV" pip install --quiet --python .venv/bin/python --no-deps --reinstall ./{wheel}
else
  "$UV" pip install --quiet --python .venv/bin/python --constraint {LOCK} --reinstall-package dart-jax "./{wheel}[{t.extras}]"
fi
.venv/bin/dart-jax --help >/dev/null
{setup}
echo "dart-jax installed in $PWD/.venv"
"""


def exit_dir(t: TPUConfig) -> str:
    """Where each host's launch writes its trainer's exit code: on the shared root, so `dart-jax
    run` sees a trainer that died at once (a bad config: 2) in seconds, not after
    `startup_timeout_s` without heartbeats; in the workdir when there is no shared root."""
    return EXITS if t.shared_root.kind == "none" else f"{t.shared_root.path}/{EXITS}/{t.name}"


def launch_script(t: TPUConfig) -> str:
    return f"""#!/usr/bin/env bash
# The trainer on this host (written by `dart-jax tpu submit`):
#   bash {LAUNCH} start   stop the trainer this script started before, then start `{t.launch_command} {CONFIG}`
#                         detached (it resumes from the run's last checkpoint), output appended to {LOG},
#                         its exit code, when it ends, to {exit_dir(t)}/HOST
#   bash {LAUNCH} stop
set -euo pipefail
cd "$(dirname "$0")"
export PATH="$PWD/.venv/bin:$PATH"
umask 002  # what the trainer writes on the shared root, the group's other users may write too
EXIT={shlex.quote(exit_dir(t))}/"$(hostname)$(pwd | tr / -)"  # a host (and a workdir: the rehearsal's hosts)
# the launch's session (setsid: its id is the wrapper's): a process of it that runs dart-jax, zombies
# aside. Not the wrapper alone: TERM ends the wrapper at once while the trainer, holding TERM, runs on
alive() {{ ps -ww -o stat=,args= --sid "$1" 2>/dev/null | awk '$1 !~ /^Z/ && /dart-jax/ {{ f = 1 }} END {{ exit !f }}'; }}
gone_within() {{ local end=$((SECONDS + $2)); while alive "$1"; do [ "$SECONDS" -lt "$end" ] || return 1; sleep 0.1; done; }}
stop() {{
  [ -f {PID} ] || return 0
  pid=$(cat {PID}); rm -f {PID}
  alive "$pid" || return 0  # gone, or its id was reused
  kill -TERM -- "-$pid" 2>/dev/null || true
  gone_within "$pid" 10 && return 0  # seconds, not tries: ps takes its own time on a loaded host
  kill -KILL -- "-$pid" 2>/dev/null || true  # JAX's preemption notice holds SIGTERM
  gone_within "$pid" 30 || true
}}
case "${{1:-start}}" in
  stop) stop ;;
  start) stop; mkdir -p "$(dirname "$EXIT")"; rm -f "$EXIT"
    setsid bash -c '"$@"; echo $? > "$0.tmp" && mv "$0.tmp" "$0"' "$EXIT" {t.launch_command} {CONFIG} \\
      >> {LOG} 2>&1 < /dev/null & echo $! > {PID} ;;
  *) echo "usage: {LAUNCH} start|stop" >&2; exit 2 ;;
esac
"""


def ship_keys(config_yaml: str, keys: Path) -> str:
    """Copy the CURVE key files the trainer reads (TRAINER_KEYS) into `keys` and point the
    config at the copies, relative to the workdir the launch runs in; no other key travels.
    A config without CURVE comes back as it is."""
    shutil.rmtree(keys, ignore_errors=True)
    keys.mkdir(parents=True)
    data, copied = yaml.safe_load(config_yaml), False
    for (section, link), fields in TRAINER_KEYS.items():
        curve = ((data.get(section) or {}).get(link) or {}).get("curve") or {}
        for field in (f for f in fields if curve.get(f)):
            source, name = Path(curve[field]), f"{section}.{link}.{field}"
            if not source.exists():
                raise UsageError(f"{section}.{link}.curve.{field}: no key at {source} to ship to the slice")
            (shutil.copytree if source.is_dir() else shutil.copy)(source, keys / name)
            curve[field], copied = f"{KEYS}/{name}", True
    return yaml.safe_dump(data, sort_keys=False) if copied else config_yaml


def ship(t: TPUConfig, directory: Path, config_yaml: str,
         run: Callable[[Sequence[str]], int], checkout: Path = CHECKOUT) -> Ship:
    """Write the run config, the scripts and the lock into `directory` and build the wheel there."""
    directory.mkdir(parents=True, exist_ok=True)
    out = Ship(directory, wheel_name(checkout))
    (directory / out.wheel).unlink(missing_ok=True)
    if (code := run(wheel_argv(directory, checkout))) != 0 or not (directory / out.wheel).is_file():
        raise UsageError(f"building the wheel of {checkout} failed (exit {code}): "
                         f"`{shlex.join(wheel_argv(directory, checkout))}`")
    shutil.copyfile(checkout / LOCK_SOURCE, directory / LOCK)
    (directory / CONFIG).write_text(ship_keys(config_yaml, directory / KEYS))
    (directory / INSTALL).write_text(install_script(t, out.wheel))
    (directory / LAUNCH).write_text(launch_script(t))
    return out
