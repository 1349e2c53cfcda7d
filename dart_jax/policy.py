"""The policy as users and tools see it: load a Hugging Face directory, score tokens, export.

    policy = load_hf("/ckpt/UI-TARS-1.5-7B", dtype="bfloat16", mesh=make_mesh(fsdp=2, tp=4))
    logits_BxTxV = policy.logits(input_ids, attention_mask, pixel_values, image_grid_thw)
    policy.export_hf("/tmp/out")

Arguments are named and shaped as transformers' processor returns them; logits are fp32 numpy.
The trainer works on `policy.graphdef, policy.params` with the functions of models/qwen25vl.py.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import jax
import numpy as np
from flax import nnx

from dart_jax.models import hf_io, qwen25vl
from dart_jax.models.inputs import ModelInputs, make_inputs


class Policy:
    def __init__(self, model: qwen25vl.Qwen25VL, *, source_dir: Path | None = None, source_dtype: str | None = None, mesh=None):
        self.config = model.config
        self.graphdef, self.params = nnx.split(model)
        self.source_dir = source_dir
        self.source_dtype = source_dtype
        self.mesh = mesh
        graphdef = self.graphdef
        self._logits = jax.jit(lambda params, inputs: qwen25vl.logits((graphdef, params), inputs))

    @property
    def model(self) -> qwen25vl.Qwen25VL:
        return nnx.merge(self.graphdef, self.params)

    def _mesh(self):
        return jax.set_mesh(self.mesh) if self.mesh is not None else contextlib.nullcontext()

    def logits(self, input_ids, attention_mask=None, pixel_values=None, image_grid_thw=None) -> np.ndarray:
        """fp32 logits [B, T, V]; values at padded positions are unspecified."""
        return self.logits_for(make_inputs(self.config, input_ids, attention_mask, pixel_values, image_grid_thw))

    def logits_for(self, inputs: ModelInputs) -> np.ndarray:
        """fp32 logits [B, T, V] for prepared (possibly bucket-padded) inputs."""
        with self._mesh():
            return np.asarray(self._logits(self.params, inputs))

    def export_hf(self, out_dir: str | os.PathLike, dtype: str | None = None) -> Path:
        """Write a Hugging Face directory; `dtype` defaults to the source checkpoint's (exact round trip)."""
        dtype = dtype or (self.source_dtype if self.source_dtype not in (None, "mixed") else None)
        return hf_io.export(self.params, self.config, out_dir, src_dir=self.source_dir, dtype=dtype)


def load_hf(path: str | os.PathLike, dtype: str = "float32", *, mesh=None, remat: str = "none") -> Policy:
    """Policy from a Hugging Face Qwen2.5-VL directory; fp32 parameters, `dtype` compute, sharded over `mesh`."""
    model, info = hf_io.load_model(path, mesh=mesh, dtype=dtype, remat=remat)
    return Policy(model, source_dir=Path(path), source_dtype=info.source_dtype, mesh=mesh)
