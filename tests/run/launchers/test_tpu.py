"""`dart-jax tpu`: the exact gcloud commands, their order, polling, failures, and the CLI's one-line errors."""

import json
import os
import re
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from dart_jax.config import dump, from_dict, load
from dart_jax.config.loader import ConfigError
from dart_jax.run.schema import RunConfig
from dart_jax.run.launchers import remote, tpu
from dart_jax.run.launchers import slice as slice_lib
from dart_jax.run.launchers.config import SharedRoot, TPUConfig
from dart_jax.run.launchers.tpu import Completed, Env, TPUCommandError

ROOT = Path(__file__).resolve().parents[3]

# The gcloud reference's synopsis of each command (cloud.google.com/sdk/gcloud/reference/compute/tpus/...),
# plus the gcloud-wide flags --project, --format and --quiet:
#   queued-resources create QR --zone --runtime-version --accelerator-type --node-id [--internal-ips]
#     [--network] [--reserved] [--service-account] [--spot] [--subnetwork] [--valid-until-duration] ...
#     (alpha only: [--best-effort])
#   queued-resources describe QR --zone;  queued-resources delete QR --zone [--async] [--force]
#   tpu-vm ssh TPU [--internal-ip] [--worker=WORKER; default="0"] [--zone] [--command=COMMAND]
#   tpu-vm scp SRC... DEST [--internal-ip] [--recurse] [--worker] [--zone]
WIDE = {"--project", "--format", "--quiet"}
DOCUMENTED = {
    "queued-resources create": {"--zone", "--runtime-version", "--accelerator-type", "--node-id", "--internal-ips",
                                "--network", "--reserved", "--service-account", "--spot", "--subnetwork",
                                "--valid-until-duration", "--best-effort"},
    "queued-resources describe": {"--zone"},
    "queued-resources delete": {"--zone", "--async", "--force"},
    "tpu-vm ssh": {"--internal-ip", "--worker", "--zone", "--command"},
    "tpu-vm scp": {"--internal-ip", "--worker", "--zone", "--recurse"},
}

GOLDEN = Path(__file__).parent / "golden"
SLICES = {  # config -> (zone, node name, accelerator type, runtime version from the TPU software versions page)
    "v5p-64.yaml": ("us-east5-a", "dart-jax-v5p-64", "v5p-64", "v2-alpha-tpuv5"),
    "v6e-64.yaml": ("us-east5-b", "dart-jax-v6e-64", "v6e-64", "v2-alpha-tpuv6e"),
    "v5e-256.yaml": ("us-west4-a", "dart-jax-v5e-256", "v5litepod-256", "v2-alpha-tpuv5-lite"),
}


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "dart_jax.cli", *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env=env)


def _golden(name: str, text: str) -> None:
    """`text` equals golden/NAME, with this interpreter and checkout written as {python} and {checkout}."""
    text = text.replace(sys.executable, "{python}").replace(str(ROOT), "{checkout}")
    assert text == (GOLDEN / name).read_text(), name


@pytest.mark.parametrize("config", sorted(SLICES))
def test_submit_dry_run_prints_the_commands_in_order(config, tmp_path):
    """Without gcloud a dry run assumes no queued resource: ship, create, poll, copy, install, launch, follow."""
    out = _cli("tpu", "submit", f"configs/tpu/{config}", "tpu.project=my-project", "--dry-run",
               env=_env_with_path(str(tmp_path)))
    assert out.returncode == 0, out.stderr
    _golden(f"submit-{config.removesuffix('.yaml')}.txt", out.stdout)


def test_submit_dry_run_on_a_suspended_slice_deletes_and_recreates_it(tmp_path):
    """gcloud says the spot slice was preempted (SUSPENDED): delete, create, then as usual."""
    _fake_gcloud(tmp_path, auth_output="me@example.com", state="SUSPENDED")
    out = _cli("tpu", "submit", "configs/tpu/v5p-64.yaml", "tpu.project=my-project", "--dry-run",
               env=_env_with_path(f"{tmp_path}:{os.environ['PATH']}"))
    assert out.returncode == 0, out.stderr
    _golden("submit-v5p-64-suspended.txt", out.stdout)


@pytest.mark.parametrize("script", [remote.INSTALL, remote.LAUNCH])
def test_the_scripts_every_worker_runs(script):
    cfg = load(RunConfig, ROOT / "configs/tpu/v5p-64.yaml")
    text = remote.install_script(cfg.tpu, remote.wheel_name()) if script == remote.INSTALL else \
        remote.launch_script(cfg.tpu)
    _golden(f"v5p-64-{script}", text)
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0  # it parses


def _argvs(config: Path, action: str) -> list[list[str]]:
    cfg = load(RunConfig, config, ["tpu.project=my-project"])
    return [list(s.argv) for s in tpu.commands_for(action, cfg.tpu, Path("ship")) if s.kind != "ship"]


@pytest.mark.parametrize("action", ["submit", "status", "logs", "stop", "delete"])
@pytest.mark.parametrize("config", sorted(SLICES))
def test_every_flag_is_documented(config, action):
    for argv in _argvs(ROOT / "configs/tpu" / config, action):
        assert argv[:3] == ["gcloud", "compute", "tpus"]
        command = " ".join(argv[3:5])
        flags = {a.split("=")[0] for a in argv if a.startswith("--")}
        assert flags <= DOCUMENTED[command] | WIDE, (command, flags - DOCUMENTED[command] - WIDE)


def test_options_map_to_flags():
    t = TPUConfig(project="p", zone="z", name="n", queued_resource="q", accelerator_type="v5p-8",
                  runtime_version="r", provisioning="reserved", network="net", subnetwork="sub", internal_ips=True,
                  service_account="sa@p.iam.gserviceaccount.com", valid_until_duration="6h", workdir="w d")
    assert tpu.create_argv(t) == [
        "gcloud", "compute", "tpus", "queued-resources", "create", "q", "--node-id=n", "--zone=z", "--project=p",
        "--quiet", "--accelerator-type=v5p-8", "--runtime-version=r", "--reserved", "--network=net", "--subnetwork=sub",
        "--service-account=sa@p.iam.gserviceaccount.com", "--valid-until-duration=6h", "--internal-ips"]
    best = TPUConfig(project="p", zone="z", name="n", provisioning="best-effort")
    assert tpu.create_argv(best)[:6] == ["gcloud", "alpha", "compute", "tpus", "queued-resources", "create"]
    assert "--best-effort" in tpu.create_argv(best) and tpu.create_argv(best)[6] == "n"  # the node's name
    assert tpu.delete_argv(t)[-2:] == ["--quiet", "--force"]
    ssh = tpu.ssh_argv(t, tpu.remote_command(t, remote.LAUNCH, "start"))
    assert ssh[-1] == "--internal-ip"
    # the workdir is quoted inside the remote command: a space cannot split it
    assert shlex.split(ssh[-2].removeprefix("--command=")) == ["bash", "w d/launch.sh", "start"]


@pytest.mark.parametrize("config", sorted(SLICES))
def test_no_gcloud_command_can_prompt(config):
    """`dart-jax run` drives gcloud with nobody at the terminal: every call says --quiet."""
    cfg = load(RunConfig, ROOT / "configs/tpu" / config, ["tpu.project=my-project"])
    argvs = [list(tpu.AUTH_ARGV), slice_lib.worker0_argv(cfg.tpu)] + [
        argv for action in ("submit", "status", "logs", "stop", "delete")
        for argv in _argvs(ROOT / "configs/tpu" / config, action)]
    argvs += [list(s.argv) for s in tpu.submit_commands(cfg.tpu, Path("ship"), "SUSPENDED") if s.kind != "ship"]
    for argv in argvs:
        assert argv[0] == "gcloud" and "--quiet" in argv, argv


@pytest.mark.parametrize("kind, source", [("nfs", "10.0.0.2:/runs"), ("gcsfuse", "my-bucket")])
def test_apt_waits_for_dpkgs_lock_right_after_boot(kind, source):
    t = TPUConfig(name="n", shared_root=SharedRoot(kind=kind, source=source))
    text = remote.install_script(t, remote.wheel_name())
    calls = re.findall(r"apt-get[^;&|}]*", text)
    assert calls and all(c.startswith("apt-get -o DPkg::Lock::Timeout=300 ") for c in calls), calls


@pytest.mark.parametrize("workdir", ["/abs", "../up", "a/../../b", ""])
def test_workdir_stays_below_home(workdir):
    with pytest.raises(ValueError, match="workdir"):
        TPUConfig(workdir=workdir)


@pytest.mark.parametrize("field, value", [("name", "--impersonate-service-account=x"), ("project", "a b"),
                                          ("zone", "us-east5-a;rm"), ("accelerator_type", "V5P-64")])
def test_names_cannot_become_flags_or_shell(field, value):
    with pytest.raises(ValueError, match=f"{field} .* is not a gcloud resource name"):
        TPUConfig(**{field: value})
    assert TPUConfig(project="example.com:my-project").project == "example.com:my-project"


class FakeGcloud:
    """Records each command; `describe` answers the scripted states in turn."""

    def __init__(self, states=("ACTIVE",), account="me@example.com", fail: str = "", existing: str | None = None):
        self.calls: list[tuple[list[str], bool]] = []
        self.states, self.account, self.fail, self.existing = list(states), account, fail, existing
        self.slept: list[float] = []
        self.now = 0.0
        self.echoed: list[str] = []

    def __call__(self, argv, capture):
        self.calls.append((list(argv), capture))
        if list(argv[:3]) == ["gcloud", "auth", "list"]:
            return Completed(0, self.account + "\n")
        if "--wheel-dir" in argv:  # the wheel build: a file where pip would write it
            (Path(argv[argv.index("--wheel-dir") + 1]) / remote.wheel_name()).write_bytes(b"wheel")
            return Completed(0)
        if "describe" in argv and capture:
            if not any("describe" in a for a, _ in self.calls[:-1]):  # submit's first look
                return Completed(0, self.existing + "\n") if self.existing else Completed(1)
            return Completed(0, self.states.pop(0) + "\n")
        return Completed(1 if self.fail and self.fail in " ".join(argv) else 0)

    def sleep(self, s):
        self.slept.append(s)
        self.now += s

    def env(self) -> Env:
        return Env(runner=self, which=lambda _: "/usr/bin/gcloud", sleep=self.sleep, clock=lambda: self.now,
                   echo=self.echoed.append)


def _cfg(tmp_path, **tpu_overrides) -> RunConfig:
    return from_dict(RunConfig, {"run": {"name": "r", "root": str(tmp_path)}, "tpu": {
        "project": "p", "zone": "z", "name": "n", "accelerator_type": "v6e-8", "runtime_version": "v2-alpha-tpuv6e",
        "poll_s": 10, **tpu_overrides}})


def _expected(cfg, steps, polls: int) -> list[tuple[list[str], bool]]:
    """auth, submit's first look, then each step (the poll `polls` times)."""
    out = [(list(tpu.AUTH_ARGV), True), (tpu.describe_argv(cfg.tpu, state_only=True), True)]
    for s in steps:
        out += [(list(s.argv), s.kind == "poll")] * (polls if s.kind == "poll" else 1)
    return out


def test_submit_ships_creates_polls_installs_launches_follows(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = _cfg(tmp_path)
    fake = FakeGcloud(states=["WAITING_FOR_RESOURCES", "WAITING_FOR_RESOURCES", "PROVISIONING", "ACTIVE"])
    assert tpu.main("submit", cfg, "c.yaml", dump(cfg), env=fake.env()) == 0
    ship = Path(".dart-jax/tpu/r")
    assert load(RunConfig, ship / "run.yaml") == cfg  # the resolved config that travels to every worker
    assert (ship / "lock.txt").read_text() == (ROOT / "requirements/lock-tpu.txt").read_text()  # the TPU hosts' lock
    assert (ship / "install.sh").read_text() == remote.install_script(cfg.tpu, remote.wheel_name())
    steps = tpu.submit_commands(cfg.tpu, ship)
    assert [s.kind for s in steps] == ["ship", "run", "poll", "run", "run", "run", "run", "follow"]
    assert fake.calls == _expected(cfg, steps, polls=4)
    assert fake.slept == [10, 10, 10]
    assert fake.echoed == ["queued resource n: WAITING_FOR_RESOURCES", "queued resource n: PROVISIONING"]


@pytest.mark.parametrize("existing, replaced", [("ACTIVE", False), ("WAITING_FOR_RESOURCES", False),
                                                 ("SUSPENDED", True), ("FAILED", True)])
def test_submit_reuses_a_live_slice_and_recreates_a_suspended_or_failed_one(tmp_path, monkeypatch, existing, replaced):
    monkeypatch.chdir(tmp_path)
    cfg = _cfg(tmp_path)
    fake = FakeGcloud(states=["ACTIVE"], existing=existing)
    assert tpu.main("submit", cfg, "c.yaml", dump(cfg), env=fake.env()) == 0
    argvs = [argv for argv, _ in fake.calls]
    assert (tpu.delete_argv(cfg.tpu) in argvs) == replaced and (tpu.create_argv(cfg.tpu) in argvs) == replaced
    if replaced:
        assert argvs.index(tpu.delete_argv(cfg.tpu)) + 1 == argvs.index(tpu.create_argv(cfg.tpu))
    assert fake.calls == _expected(cfg, tpu.submit_commands(cfg.tpu, Path(".dart-jax/tpu/r"), existing), polls=1)


@pytest.mark.parametrize("state", ["FAILED", "SUSPENDED"])
def test_a_slice_that_fails_while_submit_waits_stops_it(tmp_path, monkeypatch, state):
    monkeypatch.chdir(tmp_path)
    cfg = _cfg(tmp_path)
    fake = FakeGcloud(states=["WAITING_FOR_RESOURCES", state])
    with pytest.raises(TPUCommandError, match=f"queued resource n is {state}"):
        tpu.main("submit", cfg, "c.yaml", dump(cfg), env=fake.env())
    assert not any("ssh" in argv for argv, _ in fake.calls)


def test_waiting_past_the_deadline_stops_submit(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = _cfg(tmp_path, active_timeout_s=25)
    fake = FakeGcloud(states=["WAITING_FOR_RESOURCES"] * 10)
    with pytest.raises(TPUCommandError, match="still WAITING_FOR_RESOURCES after 25 s"):
        tpu.main("submit", cfg, "c.yaml", dump(cfg), env=fake.env())
    assert fake.slept == [10, 10, 10]


def test_a_failing_command_stops_the_sequence(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = _cfg(tmp_path)
    fake = FakeGcloud(fail="--command=bash dart-jax/install.sh")
    with pytest.raises(TPUCommandError, match="install on every worker .* exited 1"):
        tpu.main("submit", cfg, "c.yaml", dump(cfg), env=fake.env())
    assert not any("--command=bash dart-jax/launch.sh start" in argv for argv, _ in fake.calls)


def test_interrupting_logs_leaves_the_job_running(tmp_path):
    cfg = _cfg(tmp_path)
    fake = FakeGcloud()

    def runner(argv, capture):
        if "--worker=0" in argv:
            raise KeyboardInterrupt
        return fake(argv, capture)

    env = Env(runner=runner, which=lambda _: "gcloud", echo=fake.echoed.append)
    assert tpu.main("logs", cfg, "c.yaml", "", env=env) == 0
    assert fake.echoed == ["stopped following; the job keeps running (`dart-jax tpu logs CONFIG` follows it again)"]


@pytest.mark.parametrize("existing, note", [(None, "none: no such queued resource"),
                                             ("SUSPENDED", "SUSPENDED: preempted or stopped: `dart-jax tpu submit` "
                                                           "deletes it and creates it again")])
def test_status_says_the_state_and_what_submit_would_do(tmp_path, existing, note):
    cfg = _cfg(tmp_path, queued_resource="qr")
    fake = FakeGcloud(existing=existing)
    assert tpu.main("status", cfg, "c.yaml", "", env=fake.env()) == 0
    assert fake.echoed[0].startswith(f"queued resource qr: {note}")
    look = [(list(tpu.AUTH_ARGV), True), (tpu.describe_argv(cfg.tpu, state_only=True), True)]
    assert fake.calls == look + ([(tpu.describe_argv(cfg.tpu), False)] if existing else [])


def test_delete_and_stop_run_one_command_each(tmp_path):
    cfg = _cfg(tmp_path, queued_resource="qr")
    for action, argv in (("delete", tpu.delete_argv(cfg.tpu)),
                         ("stop", tpu.ssh_argv(cfg.tpu, "bash dart-jax/launch.sh stop"))):
        fake = FakeGcloud()
        assert tpu.main(action, cfg, "c.yaml", "", env=fake.env()) == 0
        assert fake.calls == [(list(tpu.AUTH_ARGV), True), (argv, False)]
    assert tpu.delete_argv(cfg.tpu)[5] == "qr"


def test_missing_settings_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="c.yaml: tpu.project: required"):
        tpu.main("status", _cfg(tmp_path, project=""), "c.yaml", "", env=FakeGcloud().env())
    with pytest.raises(ConfigError, match="tpu.accelerator_type: accelerator type 'v9-8'"):
        tpu.main("status", _cfg(tmp_path, accelerator_type="v9-8"), "c.yaml", "", env=FakeGcloud().env())


def _fake_gcloud(bin_dir: Path, auth_output: str, state: str = "") -> Path:
    """An executable `gcloud` that logs its argv (JSON lines) and answers `auth list` and
    `describe`: the first `describe` finds `state` ("": no queued resource, exit 1), later ones ACTIVE."""
    log = bin_dir / "calls.jsonl"
    script = bin_dir / "gcloud"
    script.write_text(f"""#!{sys.executable}
import json, sys
args = sys.argv[1:]
with open({str(log)!r}, "a+") as f:
    f.seek(0)
    looked = any("describe" in line for line in f)
    f.write(json.dumps(args) + "\\n")
if args[:2] == ["auth", "list"]:
    print({auth_output!r})
elif "describe" in args:
    if looked:
        print("ACTIVE")
    elif {state!r}:
        print({state!r})
    else:
        sys.exit(1)
""")
    script.chmod(0o755)
    return log


def _env_with_path(path: str) -> dict:
    return {**os.environ, "PATH": path, "PYTHONPATH": str(ROOT)}


def test_cli_without_gcloud_is_one_line_exit_2(tmp_path):
    out = _cli("tpu", "status", "configs/tpu/v5p-64.yaml", "tpu.project=p", env=_env_with_path(str(tmp_path)))
    assert out.returncode == 2, out.stderr
    assert out.stderr == "dart-jax: tpu: gcloud is not on PATH: install the Google Cloud CLI " \
                         "(https://cloud.google.com/sdk/docs/install)\n"


def test_cli_with_unauthenticated_gcloud_is_one_line_exit_2(tmp_path):
    log = _fake_gcloud(tmp_path, auth_output="")
    out = _cli("tpu", "delete", "configs/tpu/v5p-64.yaml", "tpu.project=p", env=_env_with_path(str(tmp_path)))
    assert out.returncode == 2, out.stderr
    assert out.stderr == "dart-jax: tpu: gcloud has no active account: run `gcloud auth login` " \
                         "(or `gcloud auth activate-service-account`)\n"
    assert [json.loads(line) for line in log.read_text().splitlines()] == [list(tpu.AUTH_ARGV[1:])]


def test_cli_submit_runs_every_command_through_gcloud(tmp_path):
    """The real runner: the wheel is built, everything else goes through the fake gcloud."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = _fake_gcloud(bin_dir, auth_output="me@example.com")
    overrides = ["tpu.project=my-project", f"run.root={tmp_path}", f"tpu.shared_root.path={tmp_path}"]
    out = subprocess.run([sys.executable, "-m", "dart_jax.cli", "tpu", "submit", str(ROOT / "configs/tpu/v6e-64.yaml"),
                          *overrides], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env=_env_with_path(f"{bin_dir}:{os.environ['PATH']}"))
    assert out.returncode == 0, out.stderr
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    cfg = load(RunConfig, ROOT / "configs/tpu/v6e-64.yaml", overrides)
    ship = Path(".dart-jax/tpu") / cfg.run.name
    steps = tpu.submit_commands(cfg.tpu, ship)
    look = tpu.describe_argv(cfg.tpu, state_only=True)[1:]
    assert calls == [list(tpu.AUTH_ARGV[1:]), look] + [list(s.argv[1:]) for s in steps if s.kind != "ship"]
    assert load(RunConfig, tmp_path / ship / "run.yaml") == cfg
    with zipfile.ZipFile(tmp_path / ship / remote.wheel_name()) as wheel:  # the code and its entry point
        names = wheel.namelist()
    assert "dart_jax/train/main.py" in names and "rollout_gpu/main.py" in names and "envs/server.py" in names
    assert "dart-jax = dart_jax.cli:main" in wheel_text(tmp_path / ship / remote.wheel_name(), "entry_points.txt")


def wheel_text(wheel: Path, suffix: str) -> str:
    with zipfile.ZipFile(wheel) as z:
        return z.read(next(n for n in z.namelist() if n.endswith(suffix))).decode()
