"""The GPUs of a local placement: which devices each role instance sees, and how much of
each it takes.

    placement:
      - {role: trainer, gpus: [0], memory_fraction: 0.55}
      - {role: rollout, count: 2, gpus: [0, 1], memory_fraction: 0.4}

A row's `gpus` are split among its instances: a rollout instance takes
`tensor_parallel_size` of them, the trainer all of its row's; instances beyond the devices
go round again, sharing. Each local instance then sees only its own devices
(`CUDA_VISIBLE_DEVICES`) and takes `memory_fraction` of each: the trainer through JAX's
`XLA_PYTHON_CLIENT_MEM_FRACTION` (JAX alone preallocates 75% of every GPU it sees), a
rollout worker as its engine's `gpu_memory_utilization` (vLLM alone asks 85%). A device two
instances share is refused when the config loads unless each says its fraction and they
add up to at most 1; so is a GPU role that names no devices beside one that does (it
would see, and preallocate on, every device).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable

from dart_jax.run.launchers.config import RoleSpec

GPU_ROLES = ("trainer", "rollout")


def instance_gpus(spec: RoleSpec, index: int, tensor_parallel_size: int) -> tuple[int, ...]:
    """The devices instance `index` of the row `spec` sees (empty: the row names none)."""
    if not spec.gpus:
        return ()
    take = tensor_parallel_size if spec.role == "rollout" else len(spec.gpus)
    slot = index % (len(spec.gpus) // take)
    return spec.gpus[slot * take:(slot + 1) * take]


def instance_env(spec: RoleSpec, index: int, tensor_parallel_size: int) -> dict[str, str]:
    """The environment a local instance starts with on top of the supervisor's: the row's
    `env`, its own devices, and the trainer's JAX memory fraction."""
    env = dict(spec.env)
    if gpus := instance_gpus(spec, index, tensor_parallel_size):
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
    if spec.role == "trainer" and spec.memory_fraction:
        env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{spec.memory_fraction:g}"
    return env


def check_devices(placement: Iterable[RoleSpec], tensor_parallel_size: int) -> None:
    """Refuse (one line) a local placement whose GPU roles would collide on a device."""
    rows = [s for s in placement if s.launcher == "local" and s.role in GPU_ROLES]
    named = [s.role for s in rows if s.gpus]
    if named and (blind := [s.role for s in rows if not s.gpus]):
        raise ValueError(f"run.placement: {named[0]} names its gpus but {blind[0]} names none and would see "
                         f"(and allocate on) every GPU: give it gpus too")
    takers: dict[int, list[tuple[str, float]]] = defaultdict(list)
    for spec in rows:
        if spec.role == "rollout" and spec.gpus and len(spec.gpus) % tensor_parallel_size:
            raise ValueError(f"run.placement: rollout gpus {list(spec.gpus)} do not split into instances of "
                             f"rollout.engine.tensor_parallel_size {tensor_parallel_size}")
        for i in range(spec.count):
            name = spec.role if spec.count == 1 else f"{spec.role}-{i}"
            for gpu in instance_gpus(spec, i, tensor_parallel_size):
                takers[gpu].append((name, spec.memory_fraction))
    for gpu, who in sorted(takers.items()):
        if len(who) < 2:
            continue
        names = " and ".join(n for n, _ in who)
        if any(f == 0 for _, f in who):
            raise ValueError(f"run.placement: GPU {gpu} is shared by {names} without saying how much each "
                             "takes: set memory_fraction on their rows (fractions of the device, at most 1 in all)")
        if (total := sum(f for _, f in who)) > 1:
            raise ValueError(f"run.placement: GPU {gpu} is shared by {names}, whose memory_fraction add up "
                             f"to {total:g} > 1")
