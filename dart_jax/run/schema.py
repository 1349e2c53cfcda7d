"""The run config: every package's section, composed. Every file in configs/ is one.

Each section lives beside its package, in that package's config.py (envs, data, train,
rollout_gpu, wire, eval, capacity, run and its launchers), as plain frozen dataclasses, so
loading a config imports no JAX. This module sits at the top of the house, with the commands
that run whole runs: it imports every section, so nothing below `run/` imports it (the
loader it is read with is dart_jax.config, at the bottom).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
from pathlib import PurePosixPath
from typing import ClassVar
from urllib.parse import urlsplit

from dart_jax.capacity.chips import CHIPS, parse_accelerator_type
from dart_jax.capacity.config import PlanConfig
from dart_jax.data.config import DataManagerConfig, TasksConfig
from dart_jax.eval.config import EvalConfig
from dart_jax.run.config import PolicySection, RunSection
from dart_jax.run.devices import check_devices
from dart_jax.run.launchers.config import TPUConfig
from dart_jax.train.config import SFTConfig, TrainerConfig
from dart_jax.wire import WireConfig
from dart_jax.wire.config import WeightSyncConfig
from envs.config import EnvServerConfig
from rollout_gpu.config import RolloutConfig, kv_bytes_per_token, policy_hf_config


@dataclasses.dataclass(frozen=True)
class RunConfig:
    RENAMED: ClassVar[dict[str, str]] = {"job": "tasks"}  # old key -> its name now (the loader maps it)
    FOLDED: ClassVar[dict[str, str]] = {"train": "trainer"}  # old section -> the section its keys are in now
    run: RunSection = RunSection()
    policy: PolicySection = PolicySection()
    envs: EnvServerConfig = EnvServerConfig()
    data: DataManagerConfig = DataManagerConfig()
    trainer: TrainerConfig = TrainerConfig()
    rollout: RolloutConfig = RolloutConfig()
    weights: WeightSyncConfig = WeightSyncConfig()
    tasks: TasksConfig = TasksConfig()
    sft: SFTConfig = SFTConfig()
    eval: EvalConfig = EvalConfig()
    plan: PlanConfig = PlanConfig()  # `dart-jax plan`: model shape, chip, screenshots
    tpu: TPUConfig = TPUConfig()  # `dart-jax tpu`: the Cloud TPU slice of the trainer

    def seeded(self) -> "RunConfig":
        """`run.seed`, when not 0, as every component's seed: the tiny policy's init, the
        trainer's, the rollout engines' sampling and the evaluation's (0: each keeps its own)."""
        seed, replace = self.run.seed, dataclasses.replace
        if seed == 0:
            return self
        return replace(self, policy=replace(self.policy, tiny_seed=seed), trainer=replace(self.trainer, seed=seed),
                       rollout=replace(self.rollout, engine=replace(self.rollout.engine, seed=seed)),
                       eval=replace(self.eval, seed=seed))

    def env_wires(self) -> list[WireConfig]:
        """The endpoint of each env server of the placement: the configured one, then the next ports."""
        count = sum(s.count for s in self.run.placement if s.role == "env-server") or 1
        return [dataclasses.replace(self.envs.wire, endpoint=_nth_endpoint(self.envs.wire.endpoint, i))
                for i in range(count)]

    def trainer_hosts(self) -> int:
        """Hosts the trainer spans: the TPU slice's when it is placed there, else one."""
        if not any(s.role == "trainer" and s.launcher == "tpu" for s in self.run.placement):
            return 1
        if not self.tpu.accelerator_type:
            raise ValueError("run.placement puts the trainer on launcher tpu: set tpu.accelerator_type")
        name, chips = parse_accelerator_type(self.tpu.accelerator_type)
        return -(-chips // CHIPS[name].chips_per_host)

    def __post_init__(self) -> None:
        if self.weights.dtype != self.rollout.engine.dtype:
            raise ValueError(f"weights.dtype {self.weights.dtype} must be the rollout engine's dtype "
                             f"{self.rollout.engine.dtype}: the engine loads what travels")
        if (hf := policy_hf_config(self.policy.hf_dir, self.plan.model_config)) is not None:
            engine = self.rollout.engine
            engine.check_kv_cache(kv_bytes_per_token(hf, engine.dtype, engine.tensor_parallel_size), self.policy.hf_dir or self.plan.model_config)
        check_hosts(self)
        check_devices(self.run.placement, self.rollout.engine.tensor_parallel_size)


# link -> (the section key of its endpoint, its server's role, its clients' roles)
LINKS = (("data.wire", "data-manager", ("rollout", "trainer")), ("envs.wire", "env-server", ("rollout",)),
         ("weights.announce", "trainer", ("rollout",)), ("weights.serve", "trainer", ("rollout",)))


def _where(cfg: RunConfig, role: str) -> str:
    """The host group of a role: every local row shares this machine; a Ray row's instances
    may each be on any node, and the TPU launcher's trainer is on its slice."""
    rows = [(i, s) for i, s in enumerate(cfg.run.placement) if s.role == role]
    return "here" if all(s.launcher == "local" for _, s in rows) else f"{rows[0][1].launcher}:{rows[0][0]}"


def _apart(cfg: RunConfig, a: str, b: str) -> bool:
    """Whether roles `a` and `b` are both placed and on different hosts."""
    present = {s.role for s in cfg.run.placement}
    return a in present and b in present and _where(cfg, a) != _where(cfg, b)


def _is_local(endpoint: str) -> bool:
    """Reachable only from this host: ipc, inproc, loopback addresses and localhost (0.0.0.0,
    every interface, is reached at the host's address, which the launcher tells clients)."""
    if not endpoint.startswith("tcp://"):
        return True
    host = urlsplit(endpoint).hostname or ""
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_hosts(cfg: RunConfig) -> None:
    """What a run spread over hosts needs, refused when the config loads (one line each):
    a multi-host trainer with distributed off, an endpoint only its own host reaches on a link
    between hosts, weight buckets announced at 0.0.0.0 (no weights.advertise) to rollout workers
    on other hosts, a run root that is not the shared one on a multi-host trainer, and a store
    on the shared root."""
    for key, server, clients in LINKS:
        section, name = key.split(".")
        endpoint = getattr(getattr(cfg, section), name).endpoint
        remote = [c for c in clients if _apart(cfg, server, c)]
        if remote and _is_local(endpoint):
            raise ValueError(f"{key}.endpoint {endpoint} is reached only on its own host, but the {server} and "
                             f"the {remote[0]} run on different hosts (run.placement): give the address they "
                             "reach it at (tcp://HOST:PORT, or tcp://0.0.0.0:PORT on a launcher that tells it)")
    if _apart(cfg, "trainer", "rollout") and cfg.weights.serve.endpoint.startswith("tcp://0.0.0.0:") and \
            not cfg.weights.advertise:
        raise ValueError(f"weights.serve.endpoint {cfg.weights.serve.endpoint} binds every interface and every "
                         "announcement names each trainer host's bucket server as it is bound: set weights.advertise "
                         "(tcp://{host}:{port}) for the rollout workers on other hosts")
    hosts = cfg.trainer_hosts()
    if hosts > 1 and cfg.trainer.distributed.mode == "off":
        raise ValueError(f"the trainer spans the {hosts} hosts of {cfg.tpu.accelerator_type}: "
                         "trainer.distributed.mode must be auto (off runs each host alone and its checkpoint fails)")
    shared = PurePosixPath(cfg.tpu.shared_root.path)
    root = PurePosixPath(cfg.run.root)
    if hosts > 1 and (cfg.tpu.shared_root.kind == "none" or not (root == shared or shared in root.parents)):
        raise ValueError(f"run.root {cfg.run.root!r} is each host's own disk, but orbax writes one checkpoint "
                         f"from all {hosts} hosts: set tpu.shared_root (nfs or gcsfuse) and a run.root under "
                         "its path")
    store = PurePosixPath(cfg.run.root, cfg.run.name, os.path.expanduser(cfg.data.store.db_path))
    if "data-manager" in {s.role for s in cfg.run.placement} and cfg.tpu.shared_root.kind != "none" and \
            shared in store.parents:  # refused, not moved: the run's readers find the store where the config says
        raise ValueError(f"the data manager's store {store} is on the shared root ({cfg.tpu.shared_root.kind}), "
                         "where SQLite's WAL has no locks to rely on: set data.store.db_path and blob_dir on the "
                         "head's own disk")


def _nth_endpoint(endpoint: str, i: int) -> str:
    if i == 0:
        return endpoint
    if endpoint.startswith("tcp://"):
        host, _, port = endpoint.rpartition(":")
        return f"{host}:{int(port) + i}"
    return f"{endpoint}.{i}"
