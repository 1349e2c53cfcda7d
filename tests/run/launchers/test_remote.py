"""The shared run root as a fresh Filestore share gives it (root's, 0755) and as the slice's
hosts use it: each host's user with a uid of its own. As root, this test makes such a
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

from dart_jax.run.launchers import remote
from dart_jax.run.launchers.config import SharedRoot
from dart_jax.rundir import RunDir

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("useradd") or not shutil.which("runuser"),
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
