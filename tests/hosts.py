"""Hosts for the pod rehearsal: each its own network namespace, name and Unix user.

    with Hosts.up(["slice0", "slice1", "rollout"]) as hosts:   # needs root (ip netns, useradd)
        hosts.head                       # this process's side of the bridge: the head's address
        hosts.run("slice0", ["id"], user=True)   # in slice0's network and UTS namespace, as its user

A bridge in this namespace joins one veth pair per host on a private /24. The head is one of
the hosts when `head` names it (`Hosts.up([...], head="head")`: `dart-jax run` runs in it),
else the bridge's .1 (this process, with its data manager, is the head). Every namespace gets
/etc/netns/NS/hosts (`ip netns exec` binds it over /etc/hosts) naming the head
`dart-jax-head`, as the TPU configs expect, and every host by its name; each command runs in a
fresh UTS namespace with the host's name, so `hostname` and `socket.getfqdn()` say it. A host's
user (`useradd`) has a uid of its own, different from this process's (root's), and
passwordless sudo, as a TPU VM's login has.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shlex
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

HEAD_NAME = "dart-jax-head"
LOGIN_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"


# The interpreter the rehearsal's offline install reuses may lie under root's 0700 home (pyenv):
# in the command's own mount namespace (ip netns exec makes one), /root becomes a 0711 tmpfs
# through which only root's .pyenv is seen (recursively bound: a host's command may run inside another's
# namespace, the fake gcloud inside the head's, where /root is that tmpfs already).
_SEE_ROOT_PYTHON = ("{ [ ! -d /root/.pyenv ] || { mkdir -p /run/dart-jax-root && mount --rbind /root /run/dart-jax-root"
                    " && mount -t tmpfs -o mode=0711 none /root && mkdir /root/.pyenv"
                    " && mount --bind /run/dart-jax-root/.pyenv /root/.pyenv; }; }")


def _sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=60)


@dataclasses.dataclass(frozen=True)
class Host:
    name: str  # the host name, the network namespace's name and the user's name
    address: str
    uid: int

    @property
    def home(self) -> Path:
        return Path("/home") / self.name


@dataclasses.dataclass(frozen=True)
class Hosts:
    tag: str  # prefixes every name made here (namespaces, users, links, the bridge)
    head: str  # the head's address: its host's, or the bridge's (this process)
    hosts: dict[str, Host]

    def __getitem__(self, key: str) -> Host:
        return self.hosts[key]

    def argv(self, key: str, argv: Sequence[str], env: dict[str, str] | None = None, user: bool = True) -> list[str]:
        """`argv` on host `key`: its network, its host name, as its user (else root) in its home,
        with a login's environment plus `env`."""
        h = self.hosts[key]
        inner = shlex.join(["env", *(f"{k}={v}" for k, v in (env or {}).items()), *argv])
        if user:  # a login's environment, not this process's (nothing pytest or a library set in it)
            inner = shlex.join(["runuser", "-u", h.name, "--", "env", "-i", f"HOME={h.home}", f"USER={h.name}",
                                f"LOGNAME={h.name}", f"PATH={LOGIN_PATH}", "LANG=C.UTF-8",
                                "bash", "-c", f"cd && {inner}"])
        return ["ip", "netns", "exec", h.name, "unshare", "--uts", "bash", "-c",
                f"hostname {h.name} && {_SEE_ROOT_PYTHON} && {inner}"]

    @classmethod
    @contextlib.contextmanager
    def up(cls, keys: Sequence[str], tag: str | None = None, head: str | None = None) -> Iterator[Hosts]:
        tag = tag or f"dj{os.getpid() % 100000}"
        net = f"10.213.{os.getpid() % 250}"
        hosts = {k: Host(f"{tag}-{k}", f"{net}.{10 + i}", 0) for i, k in enumerate(keys)}
        bridge, made = f"{tag}br", []
        try:
            _sh("ip", "link", "add", bridge, "type", "bridge")
            made.append(("link", bridge))
            _sh("ip", "addr", "add", f"{net}.1/24", "dev", bridge)
            _sh("ip", "link", "set", bridge, "up")
            head_address = hosts[head].address if head else f"{net}.1"
            names = "\n".join([f"127.0.0.1 localhost", f"{head_address} {HEAD_NAME}",
                               *(f"{h.address} {h.name}" for h in hosts.values())]) + "\n"
            for k, h in hosts.items():
                _sh("ip", "netns", "add", h.name)
                made.append(("netns", h.name))
                outer = f"{tag}{list(hosts).index(k)}"
                _sh("ip", "link", "add", outer, "type", "veth", "peer", "name", "eth0", "netns", h.name)
                made.append(("link", outer))
                _sh("ip", "link", "set", outer, "master", bridge, "up")
                for argv in (["ip", "addr", "add", f"{h.address}/24", "dev", "eth0"], ["ip", "link", "set", "eth0", "up"],
                             ["ip", "link", "set", "lo", "up"]):
                    _sh("ip", "netns", "exec", h.name, *argv)
                etc = Path("/etc/netns") / h.name
                etc.mkdir(parents=True, exist_ok=True)
                made.append(("etc", str(etc)))
                (etc / "hosts").write_text(names)
                _sh("useradd", "--create-home", "--shell", "/bin/bash", h.name)
                made.append(("user", h.name))
                h.home.chmod(0o700)  # what one host's user has is no other's
                uid = int(subprocess.run(["id", "-u", h.name], check=True, capture_output=True, text=True).stdout)
                hosts[k] = dataclasses.replace(h, uid=uid)
            sudoers = Path("/etc/sudoers.d") / tag  # a TPU VM's login has passwordless sudo
            made.append(("etc", str(sudoers)))
            sudoers.write_text("".join(f"{h.name} ALL=(root) NOPASSWD: ALL\n" for h in hosts.values()))
            sudoers.chmod(0o440)
            yield cls(tag, head_address, hosts)
        finally:
            for kind, name in reversed(made):
                _teardown(kind, name)


def _teardown(kind: str, name: str) -> None:
    if kind == "netns":  # what still runs in it (a trainer that outlived the test) goes first
        pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout.split()
        for pid in pids:
            subprocess.run(["kill", "-KILL", pid], capture_output=True)
    argv = {"link": ["ip", "link", "del", name], "netns": ["ip", "netns", "del", name],
            "etc": ["rm", "-rf", name], "user": ["userdel", "--remove", "--force", name]}[kind]
    subprocess.run(argv, capture_output=True, timeout=60)
    if kind == "user":  # what its vLLM engine compiled, under /tmp by user name (torch inductor's default)
        subprocess.run(["rm", "-rf", f"/tmp/torchinductor_{name}"], capture_output=True, timeout=60)
