"""A trainer checkpoint -> a Hugging Face directory (what `dart-jax export-hf` and evaluation run).

    info = export_checkpoint(run / "checkpoints", out_dir, cfg.trainer, policy_src, step=None)

One checkpoint's train state is restored with `Checkpointer` onto this host's devices and its
parameters are written by `dart_jax.models.hf_io.export` (safetensors in Hub names and torch
layout, config.json), plus the tokenizer and processor files of `policy_src` (the run's policy
directory), so transformers and vLLM load it. Only the parameters are read: the optimizer
state beside them (AdamW's two moments, twice the parameters' bytes) is left on disk as
orbax placeholders, so the host holds 4 bytes per parameter (fp32) and writes the shards
tensor by tensor as they are converted (hf_io.export).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp

from dart_jax.config import UsageError
from dart_jax.models import hf_io
from dart_jax.models.config import Qwen25VLConfig
from dart_jax.models.hf_check import source_dtype
from dart_jax.models.qwen25vl import abstract_model
from dart_jax.models.sharding import make_mesh
from dart_jax.train.checkpoint import Checkpointer, abstract_state
from dart_jax.train.config import TrainerConfig
from dart_jax.train.step import TrainFunctions, TrainState


class ExportError(UsageError):
    """A problem with the checkpoint or output paths a user gave, told in one line."""


def restore_params(checkpoint_dir: Path, trainer_cfg: TrainerConfig, model_cfg: Qwen25VLConfig,
                   step: int | None):
    """(parameters, CheckpointMeta, step) of checkpoint `step` (default: the latest)."""
    graphdef, params = abstract_model(model_cfg)
    fns = TrainFunctions(graphdef, params, trainer_cfg, make_mesh(1, len(jax.devices()), 1))
    like = TrainState(jax.ShapeDtypeStruct((), np.int32), params, jax.eval_shape(fns.optimizer.init, params))
    target = abstract_state(like, jax.tree.broadcast(fns.state_shardings, like))
    with Checkpointer(checkpoint_dir, async_save=False) as ckpt:
        step = ckpt.latest_step() if step is None else step
        if step is None or step not in ckpt.all_steps():
            which = "no checkpoint" if step is None else f"no checkpoint {step}"
            raise ExportError(f"{which} in {checkpoint_dir} (steps: {ckpt.all_steps()})")
        skip = jax.tree.map(lambda _: ocp.PLACEHOLDER, target.opt_state)  # AdamW moments stay on disk
        state, meta = ckpt.restore(dataclasses.replace(target, opt_state=skip),
                                   step)
    return state.params, meta, step


def export_checkpoint(checkpoint_dir: Path, out_dir: Path, trainer_cfg: TrainerConfig, policy_src: Path,
                      step: int | None = None, dtype: str | None = None) -> dict:
    """Write checkpoint `step` as a Hugging Face directory; returns what was written.
    `policy_src` is the policy directory the run started from (its config.json, tokenizer and
    processor files; its dtype is the export's unless `dtype` says otherwise)."""
    if not checkpoint_dir.is_dir():
        raise ExportError(f"{checkpoint_dir} is not a directory of checkpoints")
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise ExportError(f"{out_dir} exists and is not an empty directory: export writes only to a new one")
    model_cfg = hf_io.read_config(policy_src)
    params, meta, step = restore_params(checkpoint_dir, trainer_cfg, model_cfg, step)
    out = hf_io.export(params, model_cfg, out_dir, src_dir=policy_src, dtype=dtype or source_dtype(policy_src))
    return {"step": step, "policy_version": meta.policy_version, "export": str(out), "tokenizer_from": str(policy_src)}
