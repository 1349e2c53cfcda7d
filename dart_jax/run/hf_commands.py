"""`dart-jax export-hf` and `dart-jax import-hf`: trainer checkpoints <-> Hugging Face directories.

    dart-jax export-hf runs/x/checkpoints runs/x/export/hf [--step N] [--dtype bfloat16]
    dart-jax import-hf /models/UI-TARS-1.5-7B runs/ui-tars     # then: dart-jax train runs/ui-tars/config.yaml

export-hf restores one checkpoint's train state with `dart_jax.train.checkpoint.Checkpointer`
onto this host's devices and writes its parameters with `dart_jax.models.hf_io.export`
(safetensors in Hub names and torch layout, config.json), plus the tokenizer and processor
files of the run's policy directory, so transformers and vLLM load it. The run config (by
default the run's own, CHECKPOINT_DIR/../config.yaml) names that policy directory and the
optimizer whose state the checkpoint holds beside the parameters. The whole state is read
(parameters and AdamW moments): the host needs about 16 bytes per parameter.

import-hf checks that a Hugging Face directory loads (config.json, every tensor's name and
shape against the model, tokenizer.json, preprocessor_config.json) and points a run at it:
RUN_DIR/config.yaml gets policy.hf_dir (an existing config is updated, else a default run
config rooted at RUN_DIR is written).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from dart_jax import config as config_lib
from dart_jax.rundir import RunDir


class HFCommandError(Exception):
    """A problem with the user's paths or files, told in one line."""


def source_dtype(hf_dir: Path) -> str | None:
    """The checkpoint's float dtype when it has one (an export then round-trips exactly)."""
    from dart_jax.models import hf_io
    kinds = {str(e.dtype) for e in hf_io.checkpoint_index(hf_dir).values()}
    return kinds.pop() if len(kinds) == 1 else None


def restore_params(checkpoint_dir: Path, trainer_cfg, model_cfg, step: int | None):
    """(parameters, CheckpointMeta, step) of checkpoint `step` (default: the latest)."""
    import jax
    import numpy as np
    from dart_jax.models.qwen25vl import abstract_model
    from dart_jax.models.sharding import make_mesh
    from dart_jax.train.checkpoint import Checkpointer, abstract_state
    from dart_jax.train.step import Steps, TrainState
    graphdef, params = abstract_model(model_cfg)
    steps = Steps(graphdef, params, trainer_cfg, make_mesh(1, len(jax.devices()), 1))
    like = TrainState(jax.ShapeDtypeStruct((), np.int32), params, jax.eval_shape(steps.optimizer.init, params))
    target = abstract_state(like, jax.tree.broadcast(steps.state_shardings, like))
    with Checkpointer(checkpoint_dir, async_save=False) as ckpt:
        step = ckpt.latest_step() if step is None else step
        if step is None or step not in ckpt.all_steps():
            raise HFCommandError(f"no checkpoint {'' if step is None else step} in {checkpoint_dir} "
                                 f"(steps: {ckpt.all_steps()})")
        state, meta = ckpt.restore(target, step)
    return state.params, meta, step


def export_hf(checkpoint_dir: Path, out_dir: Path, config_path: Path | None = None, step: int | None = None,
              dtype: str | None = None) -> dict:
    """Write checkpoint `step` of a run as a Hugging Face directory; returns what was written."""
    from dart_jax.run.schema import RunConfig
    from dart_jax.models import hf_io
    if not checkpoint_dir.is_dir():
        raise HFCommandError(f"{checkpoint_dir} is not a directory of checkpoints")
    if out_dir.exists() and any(out_dir.iterdir()):
        raise HFCommandError(f"{out_dir} exists and is not empty: export writes only to a new directory")
    run_dir = checkpoint_dir.absolute().parent
    cfg = config_lib.load(RunConfig, config_path or run_dir / "config.yaml")
    try:  # its tokenizer and processor files are copied into the export
        src = RunDir(run_dir).policy_dir(cfg.policy.hf_dir)
    except FileNotFoundError as e:
        raise HFCommandError(str(e)) from None
    model_cfg = hf_io.read_config(src)
    params, meta, step = restore_params(checkpoint_dir, cfg.trainer, model_cfg, step)
    out = hf_io.export(params, model_cfg, out_dir, src_dir=src, dtype=dtype or source_dtype(src))
    return {"step": step, "policy_version": meta.policy_version, "export": str(out), "tokenizer_from": str(src)}


def _loads(hf_dir: Path, what: str, load):
    try:
        return load()
    except Exception as e:  # any failure to load is the answer (tokenizers raises bare Exception)
        raise HFCommandError(f"{hf_dir}: {what} does not load: {type(e).__name__}: {e}") from None


def check_hf_dir(hf_dir: Path) -> dict:
    """Raise HFCommandError unless `hf_dir` is a Qwen2.5-VL directory our loaders read."""
    from tokenizers import Tokenizer
    from dart_jax.models import hf_io
    from dart_jax.models.convert import specs_for
    from dart_jax.agent.image_processing import ImageProcessorConfig
    from dart_jax.models.qwen25vl import abstract_model
    config = _loads(hf_dir, "config.json", lambda: hf_io.read_config(hf_dir))
    specs = specs_for(abstract_model(config)[1], config)
    _loads(hf_dir, "the safetensors", lambda: hf_io.check_tensors(specs, hf_io.checkpoint_index(hf_dir),
                                                                  config.tie_word_embeddings))
    _loads(hf_dir, "tokenizer.json", lambda: Tokenizer.from_file(str(hf_dir / "tokenizer.json")))
    _loads(hf_dir, "preprocessor_config.json", lambda: ImageProcessorConfig.from_pretrained(hf_dir))
    return {"tensors": len(specs), "dtype": source_dtype(hf_dir) or "mixed"}


def import_hf(hf_dir: Path, run_dir: Path) -> dict:
    """Check `hf_dir` and set it as RUN_DIR/config.yaml's policy.hf_dir."""
    from dart_jax.run.schema import RunConfig, RunSection
    hf_dir = hf_dir.absolute()
    summary = check_hf_dir(hf_dir)
    run = RunDir.create(run_dir)
    if run.config_path.exists():
        cfg = config_lib.load(RunConfig, run.config_path)
    else:
        root = run_dir.absolute()
        cfg = RunConfig(run=RunSection(name=root.name, root=str(root.parent)))
    cfg = dataclasses.replace(cfg, policy=dataclasses.replace(cfg.policy, hf_dir=str(hf_dir)))
    run.config_path.write_text(config_lib.dump(cfg))
    return {"config": str(run.config_path), "policy.hf_dir": str(hf_dir), **summary}
