"""deploy/k8s: every manifest validates against the Kubernetes schemas (kubernetes-validate's
bundled, offline), every container runs a real `dart-jax` subcommand on a config that loads,
ports, Services, liveness probes and CURVE key files agree with that config."""

import argparse
import posixpath
import re
from pathlib import Path
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

from dart_jax.cli import build_parser
from dart_jax.config import load
from dart_jax.run.schema import RunConfig
from dart_jax.data.tasks import read_task_file

K8S = Path(__file__).resolve().parents[2] / "deploy/k8s"
CONFIG = "/etc/dart-jax/config/run.yaml"
K8S_VERSION = "1.33.0"  # GKE's regular channel
# subcommand -> the endpoints it binds; clients connect to the same keys in the shared config
BINDS = {"data-manager": ("data.wire",), "env-server": ("envs.wire",),
         "train": ("weights.announce", "weights.serve"), "rollout": ()}
# link -> (its server's subcommand, its clients' subcommands)
LINKS = {"data.wire": ("data-manager", ("rollout", "train")), "envs.wire": ("env-server", ("rollout",)),
         "weights.announce": ("train", ("rollout",)), "weights.serve": ("train", ("rollout",))}


def kustomization() -> dict:
    return yaml.safe_load((K8S / "kustomization.yaml").read_text())


def documents() -> list[dict]:
    return [d for name in kustomization()["resources"] for d in yaml.safe_load_all((K8S / name).read_text()) if d]


def pods() -> list[tuple[dict, dict]]:
    """(labels the pod will carry, pod spec) of every workload."""
    out = []
    for d in documents():
        if d["kind"] in ("Deployment", "StatefulSet"):
            spec = dict(d["spec"]["template"]["spec"])  # a StatefulSet's claim templates are volumes too
            claims = [{"name": t["metadata"]["name"], "persistentVolumeClaim": {}}
                      for t in d["spec"].get("volumeClaimTemplates", [])]
            spec["volumes"] = spec["volumes"] + claims
            out.append((d["spec"]["template"]["metadata"]["labels"], spec))
        elif d["kind"] == "JobSet":  # the JobSet and Job controllers add these labels
            for job in d["spec"]["replicatedJobs"]:
                template = job["template"]["spec"]["template"]
                implied = {"jobset.sigs.k8s.io/jobset-name": d["metadata"]["name"],
                           "batch.kubernetes.io/job-completion-index": "0"}
                out.append((template["metadata"]["labels"] | implied, template["spec"]))
    return out


def containers() -> list[tuple[dict, dict, dict]]:
    return [(labels, spec, c) for labels, spec in pods() for c in spec["containers"]]


def resolved(container: dict) -> RunConfig:
    """The config the container's command line resolves ($(POD_NAME) as Kubernetes expands it)."""
    names = {e["name"] for e in container.get("env", [])}
    overrides = container["command"][3:]
    for o in overrides:
        if "$(" in o:
            assert "$(POD_NAME)" in o and "POD_NAME" in names, o
    return load(RunConfig, K8S / "run.yaml", [o.replace("$(POD_NAME)", "rollout-abc12") for o in overrides])


def wire(cfg: RunConfig, key: str):
    section, name = key.split(".")
    return getattr(getattr(cfg, section), name)


def files(spec: dict, container: dict) -> set[str]:
    """Paths the container sees from the ConfigMap and the CURVE Secret."""
    volumes = {v["name"]: v for v in spec["volumes"]}
    config_files = [posixpath.basename(f) for g in kustomization()["configMapGenerator"] for f in g["files"]]
    out = set()
    for m in container["volumeMounts"]:
        v = volumes[m["name"]]
        if "configMap" in v:
            assert v["configMap"]["name"] == "dart-jax-config"
            out |= {f"{m['mountPath']}/{f}" for f in config_files}
        if "secret" in v:
            assert v["secret"]["secretName"] == "dart-jax-curve"
            out |= {f"{m['mountPath']}/{i['path']}" for i in v["secret"]["items"]}
    return out


def test_kustomization_lists_every_manifest_and_generates_config_and_keys():
    k = kustomization()
    manifests = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml", "run.yaml"}
    assert sorted(k["resources"]) == sorted(manifests)
    assert {d["kind"] for d in documents()} == {"PersistentVolumeClaim", "Service", "StatefulSet", "Deployment",
                                                 "JobSet"}
    secret_files = {posixpath.basename(f) for g in k["secretGenerator"] for f in g["files"]}
    for name in secret_files:
        stem, _, kind = name.partition(".")
        assert kind in ("key", "key_secret") and f"{stem}.key" in secret_files and f"{stem}.key_secret" in secret_files
    assert (K8S / ".gitignore").read_text().split() == ["keys/"]  # key files are made, never committed


def test_every_manifest_validates_against_the_kubernetes_schemas():
    """Strict: an unknown or misspelt field is an error. The JobSet is a custom resource whose
    schema the validator lacks: its pod template is validated as the batch/v1 Job it stamps out."""
    for d in documents():
        if d["kind"] == "JobSet":
            for job in d["spec"]["replicatedJobs"]:
                as_job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": job["name"]},
                          "spec": job["template"]["spec"]}
                kubernetes_validate.validate(as_job, K8S_VERSION, strict=True)
        else:
            kubernetes_validate.validate(d, K8S_VERSION, strict=True)
    broken = next(d for d in documents() if d["kind"] == "StatefulSet")
    broken = broken | {"spec": broken["spec"] | {"replica": 1}}
    with pytest.raises(kubernetes_validate.ValidationError, match="'replica' was unexpected"):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


def probed(container: dict) -> str | None:
    """The link a container's liveness probe pings (`dart-jax ping CONFIG LINK ...`), if any."""
    probe = container.get("livenessProbe", {}).get("exec", {}).get("command", [])
    return probe[3] if probe[:2] == ["dart-jax", "ping"] else None


def test_every_server_has_a_liveness_probe_that_pings_it_at_its_own_address():
    for _, spec, c in containers():
        role = c["command"][1]
        links = [k for k in BINDS[role] if k in ("data.wire", "envs.wire")]  # servers that answer Ping
        assert [probed(c)] == (links or [None]), role
        if not links:
            continue
        probe = c["livenessProbe"]["exec"]["command"]
        assert probe[2] == CONFIG
        args = build_parser().parse_args(probe[1:])  # a real command line of `dart-jax ping`
        cfg = load(RunConfig, K8S / "run.yaml", [o.replace("$(POD_NAME)", "x") for o in args.overrides])
        u = urlsplit(wire(cfg, args.link).endpoint)
        assert u.hostname == "127.0.0.1" and u.port in {p["containerPort"] for p in c["ports"]}
        assert args.timeout < c["livenessProbe"]["timeoutSeconds"]


def test_roles_are_real_subcommands_on_a_config_that_loads():
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    seen = []
    for _, spec, c in containers():
        assert c["command"][0] == "dart-jax" and c["command"][1] in sub.choices, c["command"]
        assert c["command"][2] == CONFIG and CONFIG in files(spec, c)
        resolved(c)
        seen.append(c["command"][1])
    assert sorted(seen) == sorted(BINDS)
    cfg = load(RunConfig, K8S / "run.yaml")
    assert read_task_file(K8S / posixpath.basename(cfg.data.tasks.task_file))
    assert cfg.data.tasks.task_file in files(*next((s, c) for _, s, c in containers()
                                                   if c["command"][1] == "data-manager"))


def test_each_server_binds_what_it_exposes_and_clients_reach_it_by_service():
    services = [d for d in documents() if d["kind"] == "Service"]
    for labels, _, c in containers():
        cfg = resolved(c)
        bound = {urlsplit(wire(cfg, key).endpoint) for key in BINDS[c["command"][1]]}
        assert {u.hostname for u in bound} <= {"0.0.0.0"}
        ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
        assert sorted(ports.values()) == sorted(u.port for u in bound)
        for s in services:
            if all(labels.get(k) == v for k, v in s["spec"]["selector"].items()):
                for p in s["spec"]["ports"]:
                    assert ports[p["targetPort"]] == p["port"], (s["metadata"]["name"], p)
    base = load(RunConfig, K8S / "run.yaml")
    names = {s["metadata"]["name"]: {p["port"] for p in s["spec"]["ports"]} for s in services}
    for key in LINKS:
        u = urlsplit(wire(base, key).endpoint)
        assert u.port in names[u.hostname], (key, u)


@pytest.mark.parametrize("link", sorted(LINKS))
def test_curve_key_files_are_mounted_where_each_side_reads_them(link):
    server, clients = LINKS[link]
    curve = wire(load(RunConfig, K8S / "run.yaml"), link).curve
    assert curve is not None
    client_public = curve.client_secret_key.removesuffix("_secret").replace("/keys/", "/clients/")
    for _, spec, c in containers():
        seen = files(spec, c)
        if c["command"][1] == server:
            assert {curve.server_secret_key, client_public} <= seen
            assert posixpath.dirname(client_public) == curve.authorized_clients_dir
        if c["command"][1] in clients or probed(c) == link:
            assert {curve.server_public_key, curve.client_secret_key} <= seen


def test_each_pod_gets_only_the_secret_keys_it_uses():
    cfg = load(RunConfig, K8S / "run.yaml")
    for _, spec, c in containers():
        role = c["command"][1]
        need = {wire(cfg, k).curve.server_secret_key for k, (server, _) in LINKS.items() if server == role}
        need |= {wire(cfg, k).curve.client_secret_key for k, (_, clients) in LINKS.items()
                 if role in clients or probed(c) == k}
        assert {f for f in files(spec, c) if f.endswith(".key_secret")} == need, role


def test_the_jobsets_host_names_get_a_headless_service_of_their_own():
    """The JobSet controller names its pods' subdomain `spec.network.subdomain` (default: the
    JobSet's name) and makes that headless Service only when no Service has the name: one of
    ours with it would leave the hosts' names (the coordinator's, weights.advertise's) unresolved."""
    services = {d["metadata"]["name"] for d in documents() if d["kind"] == "Service"}
    jobsets = [d for d in documents() if d["kind"] == "JobSet"]
    assert jobsets
    for d in jobsets:
        network = d["spec"].get("network", {})
        assert network.get("enableDNSHostnames", True)
        assert network.get("subdomain", d["metadata"]["name"]) not in services


CACHES = {"XDG_CACHE_HOME", "HF_HOME", "VLLM_CACHE_ROOT", "TRITON_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE",
          "JAX_COMPILATION_CACHE_DIR"}


def images() -> dict[str, tuple[int | None, dict[str, str]]]:
    """Each image deploy/docker builds (the `-t NAME` of its header): the uid of its user (None:
    root) and its environment."""
    out = {}
    for dockerfile in (K8S.parent / "docker").glob("*.Dockerfile"):
        text = dockerfile.read_text().replace("\\\n", " ")
        user = re.search(r"useradd .*--uid (\d+)", text) if re.search(r"^USER dart$", text, re.M) else None
        env = dict(kv.split("=", 1) for line in re.findall(r"^ENV (.*)$", text, re.M) for kv in line.split())
        out[re.search(r"-t (\S+) ", text).group(1)] = (int(user.group(1)) if user else None, env)
    return out


def test_each_pod_runs_as_its_images_user_with_its_volumes_and_caches_writable():
    """A fresh volume is root's: fsGroup gives it to the group 1000 (the images' `dart`); a pod of
    an image with a user runs as it, never as root; every cache lies on a writable volume or in
    the user's home (the TPU image runs as root: libtpu opens the devices)."""
    built = images()
    for _, spec, container in containers():
        uid, env = built[container["image"]]
        context = spec.get("securityContext", {})
        assert context.get("fsGroup") == 1000, container["name"]
        if uid is None:
            assert not context.get("runAsNonRoot"), container["name"]
        else:
            assert (context.get("runAsUser"), context.get("runAsNonRoot")) == (uid, True), container["name"]
        env = env | {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
        writable = [m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")]
        writable += [env["HOME"]] if uid is not None and "HOME" in env else []
        for key in CACHES & set(env):
            assert any(posixpath.commonpath([env[key], w]) == w for w in writable), (container["name"], key)
