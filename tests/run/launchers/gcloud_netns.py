"""A `gcloud` for the pod rehearsal that only carries commands to the rehearsal's hosts.

    gcloud_netns.install(bin_dir, hosts, workers, env_of)   # bin_dir/gcloud, put it first on PATH

`tpu-vm ssh --worker=all --command=C` runs C on every worker at once (tests.hosts: its network
namespace, its host name, as its user, in its home, with the environment a slice gives that
worker); `tpu-vm scp FILES NAME:DEST --worker=all` copies the files into each worker's home
and gives them to its user; `queued-resources describe` says ACTIVE, `tpu-vm describe`
worker 0's address, `auth list` an account, `queued-resources delete` notes the id in
bin_dir/released (the slice is given back). Anything else is refused (exit 2). Run by a user
other than root (a head of its own), it runs itself again through sudo, as that user may:
entering the hosts' namespaces takes root.
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def install(bin_dir: Path, hosts, workers: list[str], env_of: list[dict]) -> Path:
    bin_dir.mkdir(parents=True, exist_ok=True)
    spec = {"tag": hosts.tag, "head": hosts.head, "workers": workers, "env": env_of,
            "hosts": {k: [h.name, h.address, h.uid] for k, h in hosts.hosts.items()}}
    (bin_dir / "hosts.json").write_text(json.dumps(spec))
    script = bin_dir / "gcloud"
    script.write_text(f"#!{sys.executable}\nimport os, sys\n"
                      "if os.geteuid():\n    os.execvp('sudo', ['sudo', '-n', sys.executable, __file__, *sys.argv[1:]])\n"
                      f"sys.path.insert(0, {str(ROOT)!r})\n"
                      f"from tests.run.launchers.gcloud_netns import main\nsys.exit(main(sys.argv[1:], {str(bin_dir / 'hosts.json')!r}))\n")
    script.chmod(0o755)
    return script


def _flag(args: list[str], name: str) -> str | None:
    return next((a.split("=", 1)[1] for a in args if a.startswith(f"--{name}=")), None)


def main(args: list[str], spec_path: str) -> int:
    from tests.hosts import Host, Hosts
    spec = json.loads(Path(spec_path).read_text())
    hosts = Hosts(spec["tag"], spec["head"], {k: Host(*v) for k, v in spec["hosts"].items()})
    workers = spec["workers"]
    if args[:2] == ["auth", "list"]:
        print("rehearsal@example.com")
        return 0
    if args[:3] == ["compute", "tpus", "queued-resources"] and args[3] == "describe":
        print("ACTIVE")
        return 0
    if args[:4] == ["compute", "tpus", "queued-resources", "delete"]:
        with open(Path(spec_path).parent / "released", "a") as f:
            f.write(args[4] + "\n")
        return 0
    if args[:4] == ["compute", "tpus", "tpu-vm", "describe"]:
        print(hosts[workers[0]].address)
        return 0
    if args[:3] != ["compute", "tpus", "tpu-vm"] or args[3] not in ("ssh", "scp"):
        print(f"gcloud (rehearsal): refused {args}", file=sys.stderr)
        return 2
    which = _flag(args, "worker")
    chosen = list(enumerate(workers)) if which == "all" else [(int(which), workers[int(which)])]
    if args[3] == "ssh":  # on every chosen worker at once, as gcloud's --worker=all does
        procs = [subprocess.Popen(hosts.argv(key, ["bash", "-c", _flag(args, "command")], env=spec["env"][i]))
                 for i, key in chosen]
        return next((code for code in [p.wait() for p in procs] if code), 0)
    return next((code for code in (_scp(args, hosts[key]) for _, key in chosen) if code), 0)


def _scp(args: list[str], host) -> int:
    """`scp FILES NAME:DEST`: into the worker's home, its user's (as scp as that user leaves them)."""
    files = [a for a in args[4:] if not a.startswith("--")]
    dest = host.home / files[-1].split(":", 1)[1]
    dest.mkdir(parents=True, exist_ok=True)
    for f in map(Path, files[:-1]):
        (shutil.copytree(f, dest / f.name, dirs_exist_ok=True) if f.is_dir() else shutil.copy(f, dest / f.name))
    return subprocess.run(["chown", "-R", f"{host.name}:{host.name}", str(dest)]).returncode
