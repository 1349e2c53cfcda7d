"""What submit ships to every worker besides the wheel: the CURVE keys the trainer uses and
no other. The shared run root as a fresh Filestore share gives it (root's, 0755) and as the
slice's hosts use it, each host's user with a uid of its own: as root, a test makes such a
directory, runs the install's share part for two users made here (`useradd`) and writes as
each (`runuser`) what a run writes there: the head's run directory, a host's checkpoint step
in it, another host's metrics and exit code."""

import grp
import os
import pwd
import shutil
import stat
import subprocess
import traceback
import uuid
from pathlib import Path

import pytest

from dart_jax.config import dump, load
from dart_jax.run.schema import RunConfig
from dart_jax.run.launchers import remote
from dart_jax.run.launchers.config import SharedRoot
from dart_jax.run import policy_dirs  # noqa: F401: prepare's import, loaded before a child runs it as a user
from dart_jax.run.main import prepare
from dart_jax.rundir import RunDir
from dart_jax.wire import curve as curve_lib

ROOT = Path(__file__).resolve().parents[3]

as_root = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("useradd") or not shutil.which("runuser"),
                             reason="makes users and runs as them: needs root, useradd and runuser")


def _free_gid() -> int:
    taken = {g.gr_gid for g in grp.getgrall()}
    return next(gid for gid in range(23000, 24000) if gid not in taken)


@pytest.fixture
def hosts():
    """Two users, as gcloud makes one on each VM (the head's and a slice host's), and the group
    name the install will make; removed afterwards."""
    tag = uuid.uuid4().hex[:6]
    users = [f"h5{tag}{i}" for i in range(2)]
    for user in users:
        subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/bash", user], check=True)
    yield users
    for user in users:
        subprocess.run(["userdel", user], check=False)


def _as(user: str, script: str, umask: str = "022") -> subprocess.CompletedProcess:
    return subprocess.run(["runuser", "-u", user, "--", "bash", "-c", f"umask {umask}; {script}"],
                          capture_output=True, text=True, timeout=120, env={"PATH": os.environ["PATH"]})


def _forked_as(user: str, fn) -> int:
    """`fn()` in a child of this process running as `user` (this checkout's interpreter may be
    out of other users' reach); its exit code."""
    pid = os.fork()
    if pid == 0:
        try:
            pw = pwd.getpwnam(user)
            os.initgroups(user, pw.pw_gid)
            os.setgid(pw.pw_gid)
            os.setuid(pw.pw_uid)
            os.umask(0o022)
            fn()
            os._exit(0)
        except BaseException:
            traceback.print_exc()
            os._exit(1)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def _share_access(share: Path, gid: int, user: str, bin_dir: Path) -> None:
    """The install's share part as `user` runs it on its host: sudo is root here (a shim)."""
    text = remote.share_access(SharedRoot(kind="nfs", source="10.0.0.2:/runs", path=str(share), gid=gid))
    subprocess.run(["bash", "-euo", "pipefail", "-c", text], check=True, timeout=60,
                   env={"PATH": f"{bin_dir}:{os.environ['PATH']}", "USER": user})


@as_root
def test_every_hosts_user_writes_a_fresh_share(hosts, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sudo").write_text('#!/bin/sh\nexec "$@"\n')
    (bin_dir / "sudo").chmod(0o755)
    share = Path("/tmp") / f"h5-share-{uuid.uuid4().hex[:8]}"  # reachable by every user, unlike tmp_path
    share.mkdir(mode=0o755)
    share.chmod(0o755)  # what a fresh Filestore share is: root's, 0755
    gid = _free_gid()
    head, host = hosts
    try:
        assert _as(head, f"mkdir {share}/run").returncode != 0  # without the install: nobody but root
        for user in hosts:  # each host's install (the head joins the group the same way)
            _share_access(share, gid, user, bin_dir)
        assert stat.S_IMODE(share.stat().st_mode) == 0o2775 and share.stat().st_gid == gid
        run = share / "run"
        assert _forked_as(head, lambda: RunDir.create(run)) == 0  # `dart-jax run` on the head (umask 022)
        # a slice host (the launch's umask) writes a checkpoint step, metrics, a log and its exit code
        wrote = _as(host, f"mkdir -p {run}/checkpoints/1/state && echo '{{}}' >> {run}/metrics/trainer.jsonl && "
                          f"echo x >> {run}/logs/trainer.log && mkdir -p {share}/{remote.EXITS}/n && "
                          f"echo 2 > {share}/{remote.EXITS}/n/w0", umask="002")
        assert wrote.returncode == 0, wrote.stderr
        # the head (another uid) writes where the host made directories, and clears exit codes
        again = _as(head, f"touch {run}/checkpoints/1/state/more && rm {share}/{remote.EXITS}/n/w0")
        assert again.returncode == 0, again.stderr
    finally:
        shutil.rmtree(share)
        name = grp.getgrgid(gid).gr_name if gid in {g.gr_gid for g in grp.getgrall()} else None
        if name:
            subprocess.run(["groupdel", name], check=False)


@as_root
def test_a_head_that_cannot_write_a_fresh_share_is_told_the_one_command_that_lets_it(hosts, tmp_path, capfd):
    """`dart-jax run`'s start (prepare) as a non-root head on a fresh share (root's 0755, a mount
    point): refused on one line naming the share step; that command, then a new login, and the
    same start makes the run directory on the share, the group's and group-writable."""
    head = hosts[0]
    share = Path("/tmp") / f"h1-share-{uuid.uuid4().hex[:8]}"  # reachable by every user, unlike tmp_path
    policy = Path(f"{share}-policy")  # the head's policy, readable by its user (a config.json is what prepare checks)
    share.mkdir(mode=0o755)
    share.chmod(0o755)
    policy.mkdir()
    shutil.copy(ROOT / "configs/models/qwen2.5-vl-7b.config.json", policy / "config.json")
    policy.chmod(0o755)
    subprocess.run(["mount", "--bind", str(share), str(share)], check=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sudo").write_text('#!/bin/sh\nexec "$@"\n')  # the head's login has sudo (root here)
    (bin_dir / "sudo").chmod(0o755)
    gid = _free_gid()
    cfg = load(RunConfig, ROOT / "configs/tpu/v5p-64.yaml",
               [f"run.root={share}", f"tpu.shared_root.path={share}", f"tpu.shared_root.gid={gid}", f"policy.hf_dir={policy}",
                f"data.store.db_path={share}-store/s.sqlite", f"data.store.blob_dir={share}-store/blobs"]).seeded()
    try:
        capfd.readouterr()
        assert _forked_as(head, lambda: prepare(cfg)) == 1
        err = capfd.readouterr().err.strip().splitlines()[-1]
        assert err.startswith("dart_jax.run.launchers.remote.ShareAccessError: ") and head in err, err
        command = err.split("`")[1]
        assert command == remote.share_command(cfg.tpu.shared_root)
        subprocess.run(["bash", "-euo", "pipefail", "-c", command], check=True, timeout=60,
                       env={"PATH": f"{bin_dir}:{os.environ['PATH']}", "USER": head})
        assert _forked_as(head, lambda: prepare(cfg)) == 0  # a new login: initgroups reads the group
        run = share / cfg.run.name
        assert (run / "config.yaml").is_file() and run.stat().st_uid == pwd.getpwnam(head).pw_uid
        assert (stat.S_IMODE(share.stat().st_mode), share.stat().st_gid, run.stat().st_gid) == (0o2775, gid, gid)
        assert run.stat().st_mode & stat.S_IWGRP
    finally:
        subprocess.run(["umount", "--lazy", str(share)])
        subprocess.run(["rm", "-rf", str(share), str(policy), f"{share}-store"])
        name = grp.getgrgid(gid).gr_name if gid in {g.gr_gid for g in grp.getgrall()} else None
        if name:
            subprocess.run(["groupdel", name], check=False)


def _curve(keys: Path, server: str) -> str:
    return (f"{{server_public_key: {keys}/{server}.key, server_secret_key: {keys}/{server}.key_secret, "
            f"client_secret_key: {keys}/client.key_secret, authorized_clients_dir: {keys}/clients}}")


def test_submit_ships_the_curve_keys_the_trainer_uses_and_no_other(tmp_path, monkeypatch):
    keys = tmp_path / "head-keys"
    for name in ("data-manager", "env-server", "trainer", "client"):
        curve_lib.generate(keys, name)
    (keys / "clients").mkdir()
    shutil.copy(keys / "client.key", keys / "clients")
    cfg = load(RunConfig, ROOT / "configs/tpu/v5p-64.yaml", [
        f"data.wire.curve={_curve(keys, 'data-manager')}", "envs.wire={endpoint: 'tcp://127.0.0.1:5555', "
        f"curve: {_curve(keys, 'env-server')}}}",
        f"weights.announce.curve={_curve(keys, 'trainer')}", f"weights.serve.curve={_curve(keys, 'trainer')}"])
    ship = tmp_path / "ship"
    shipped = remote.ship(cfg.tpu, ship, dump(cfg), lambda argv: (ship / remote.wheel_name()).write_bytes(b"") and 0)
    assert ship / remote.KEYS in shipped.files  # scp --recurse takes it to every worker
    assert sorted(p.name for p in (ship / remote.KEYS).iterdir()) == [
        "data.wire.client_secret_key", "data.wire.server_public_key", "weights.announce.authorized_clients_dir",
        "weights.announce.server_secret_key", "weights.serve.authorized_clients_dir", "weights.serve.server_secret_key"]
    monkeypatch.chdir(ship)  # the launch runs in the workdir: the config's key paths are the shipped copies
    on_slice = load(RunConfig, ship / remote.CONFIG)
    for (section, link), fields in remote.TRAINER_KEYS.items():
        curve = getattr(getattr(on_slice, section), link).curve
        assert [getattr(curve, f) for f in fields] == [f"{remote.KEYS}/{section}.{link}.{f}" for f in fields]
    assert (Path(on_slice.data.wire.curve.client_secret_key).read_bytes()
            == (keys / "client.key_secret").read_bytes())
    assert Path(on_slice.weights.serve.curve.authorized_clients_dir, "client.key").is_file()

    no_curve = load(RunConfig, ROOT / "configs/tpu/v5p-64.yaml")
    remote.ship(no_curve.tpu, ship, dump(no_curve), lambda argv: (ship / remote.wheel_name()).write_bytes(b"") and 0)
    assert (ship / remote.CONFIG).read_text() == dump(no_curve) and not any((ship / remote.KEYS).iterdir())
