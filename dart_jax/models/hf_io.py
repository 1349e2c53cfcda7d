"""Hugging Face checkpoint import (sharded, leaf by leaf) and export (streamed safetensors shards).

Import reads each device's block of each parameter straight from the safetensors files with
positioned reads (no mmap, no full tensor on the host when the parameter is sharded), through
`jax.make_array_from_callback`, so a host never holds a second full copy of the checkpoint. A
stacked parameter (decoder layers, vision blocks) reads its block from each layer's tensor.
Export writes shards whose headers are known in advance from the parameter specs, streaming
tensors from `convert.hf_buckets` (the same conversion weight sync uses).

    model, info = load_model(path, mesh=mesh, dtype="bfloat16")
    export(nnx.state(model), model.config, out_dir, src_dir=path, dtype=info.source_dtype)
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import jax
import ml_dtypes
import numpy as np
from flax import nnx

from dart_jax.models.config import Qwen25VLConfig
from dart_jax.models.convert import ParamSpec, hf_buckets, specs_for
from dart_jax.models.qwen25vl import Qwen25VL, abstract_model
from dart_jax.models.sharding import var_sharding
from dart_jax.wire.weights import canonical_hf_name

log = logging.getLogger(__name__)

_DTYPES = {
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F64": np.dtype(np.float64),
}
_CODES = {v: k for k, v in _DTYPES.items()}
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.json",
    "chat_template.jinja",
    "preprocessor_config.json",
    "processor_config.json",
    "video_preprocessor_config.json",
    "generation_config.json",
)
_READ_CHUNK = 8 << 20


@dataclass(frozen=True)
class TensorEntry:
    file: Path
    name: str  # as written in the file
    dtype: np.dtype
    shape: tuple[int, ...]
    offset: int  # absolute byte offset of the data in the file

    def read(self, index: tuple[slice, ...], out_dtype, transpose: bool = False) -> np.ndarray:
        """The block `index` of this tensor (transposed if asked, for 2D), read in row chunks with
        positioned reads into one output buffer: page cache, not RSS, holds the file."""
        index = tuple(index) + (slice(None),) * (len(self.shape) - len(index))
        if not self.shape:
            return self._rows(0, 1).reshape(()).astype(out_dtype)
        rows = range(*index[0].indices(self.shape[0]))
        inner = tuple(len(range(*s.indices(n))) for s, n in zip(index[1:], self.shape[1:]))
        if transpose and len(inner) != 1:
            raise ValueError(f"transposed read of {self.name} needs a 2D tensor, has shape {self.shape}")
        out = np.empty(inner + (len(rows),) if transpose else (len(rows),) + inner, out_dtype)
        row_bytes = int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize
        per_chunk = max(1, _READ_CHUNK // max(1, row_bytes))
        for c in range(0, len(rows), per_chunk):
            sub = rows[c : c + per_chunk]
            block = self._rows(sub.start, sub[-1] + 1).reshape(-1, *self.shape[1:])[:: sub.step]
            piece = block[(slice(None),) + index[1:]]
            if transpose:
                out[:, c : c + len(sub)] = piece.T
            else:
                out[c : c + len(sub)] = piece
        return out

    def _rows(self, lo: int, hi: int) -> np.ndarray:
        row_bytes = int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize
        n = (hi - lo) * row_bytes
        buf = bytearray(n)
        with open(self.file, "rb", buffering=0) as f:
            f.seek(self.offset + lo * row_bytes)
            if f.readinto(buf) != n:
                raise OSError(f"{self.file}: short read of tensor {self.name}")
        return np.frombuffer(buf, self.dtype)


def read_header(file: Path) -> dict[str, TensorEntry]:
    with open(file, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    entries = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        if meta["dtype"] not in _DTYPES:
            raise ValueError(f"{file}: tensor {name} has unsupported dtype {meta['dtype']}")
        entries[name] = TensorEntry(file, name, _DTYPES[meta["dtype"]], tuple(meta["shape"]), 8 + n + meta["data_offsets"][0])
    return entries


def checkpoint_index(path: Path) -> dict[str, TensorEntry]:
    """canonical HF name -> entry, over every safetensors file of the checkpoint directory."""
    index_file = path / "model.safetensors.index.json"
    if index_file.exists():
        files = sorted({path / f for f in json.loads(index_file.read_text())["weight_map"].values()})
    else:
        files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no safetensors files in {path}")
    out: dict[str, TensorEntry] = {}
    for file in files:
        for name, entry in read_header(file).items():
            key = canonical_hf_name(name)
            if key in out:
                raise ValueError(f"tensor {key} appears twice ({out[key].name} in {out[key].file.name}, {name} in {file.name})")
            out[key] = entry
    return out


def read_config(path: str | os.PathLike) -> Qwen25VLConfig:
    return Qwen25VLConfig.from_hf(json.loads((Path(path) / "config.json").read_text()))


@dataclass(frozen=True)
class LoadInfo:
    source_dtype: str  # the checkpoint's float dtype ("mixed" if several)


def check_tensors(specs: Sequence[ParamSpec], index: dict[str, TensorEntry], tied: bool) -> None:
    want = {s.hf_name: s for s in specs}
    extra = set(index) - set(want)
    if tied and "lm_head.weight" in extra:
        log.warning("tied embeddings: ignoring lm_head.weight in the checkpoint")
        extra.discard("lm_head.weight")
    missing = sorted(set(want) - set(index))
    shaped = sorted(f"{n} {index[n].shape} (expected {want[n].hf_shape})" for n in want if n in index and index[n].shape != want[n].hf_shape)
    problems = []
    if missing:
        problems.append(f"missing tensors: {', '.join(missing)}")
    if extra:
        problems.append(f"unexpected tensors: {', '.join(sorted(extra))}")
    if shaped:
        problems.append(f"mis-shaped tensors: {', '.join(shaped)}")
    if problems:
        raise ValueError("checkpoint does not match config.json: " + "; ".join(problems))


def load_model(
    path: str | os.PathLike,
    *,
    mesh: jax.sharding.Mesh | None = None,
    dtype="float32",
    remat: str = "none",
    vision_remat: str | None = None,
    attention: str = "auto",
) -> tuple[Qwen25VL, LoadInfo]:
    """Qwen25VL with fp32 parameters read from a Hugging Face directory, sharded over `mesh`."""
    path = Path(path)
    config = read_config(path)
    graphdef, abstract = abstract_model(config, dtype=dtype, remat=remat, vision_remat=vision_remat, attention=attention)
    specs = specs_for(abstract, config)
    index = checkpoint_index(path)
    check_tensors(specs, index, config.tie_word_embeddings)
    single = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    flat = dict(nnx.to_flat_state(abstract))
    per_path: dict[tuple, list[ParamSpec]] = {}
    for spec in specs:
        per_path.setdefault(spec.path, []).append(spec)
    for p, layers in per_path.items():
        var = flat[p]
        sharding = single if mesh is None else var_sharding(var, mesh)
        entries = [index[s.hf_name] for s in layers]
        var.set_value(_load_one(layers, entries, var.get_value().shape, sharding, var.get_value().dtype))
    model = nnx.merge(graphdef, nnx.from_flat_state(list(flat.items())))
    kinds = {index[s.hf_name].dtype for s in specs}
    source = str(next(iter(kinds))) if len(kinds) == 1 else "mixed"
    return model, LoadInfo(source_dtype=source)


def _load_one(specs: list[ParamSpec], entries: list[TensorEntry], shape, sharding, dtype) -> jax.Array:
    """One parameter from its tensors: one spec, or one per layer of a stacked parameter."""
    if specs[0].layer is None:
        return jax.make_array_from_callback(shape, sharding, lambda index: _read_block(specs[0], entries[0], index, dtype))

    def stacked_block(index):
        index = _full(index, shape)
        layers = range(*index[0].indices(shape[0]))
        return np.stack([_read_block(specs[i], entries[i], index[1:], dtype) for i in layers])

    return jax.make_array_from_callback(shape, sharding, stacked_block)


def _read_block(spec: ParamSpec, entry: TensorEntry, index, dtype) -> np.ndarray:
    """The Flax-layout block `index` of one tensor, read from its torch-layout file block."""
    index = _full(index, spec.shape)
    if spec.kind == "linear":  # read straight into the [in, out] block
        return entry.read(spec.hf_index(index), dtype, transpose=True)
    block = spec.from_hf(entry.read(spec.hf_index(index), dtype))
    return block[index[0]] if spec.kind == "conv3d" else block


def _full(index, shape) -> tuple[slice, ...]:
    return tuple(index) + (slice(None),) * (len(shape) - len(index))


def export(
    state,
    config: Qwen25VLConfig,
    out_dir: str | os.PathLike,
    *,
    src_dir: str | os.PathLike | None = None,
    dtype=None,
    shard_bytes: int = 4 << 30,
    bucket_bytes: int = 256 << 20,
) -> Path:
    """Write safetensors shards (original HF names, torch layout), the index, config.json and the
    tokenizer/processor files found in `src_dir`. `dtype` (e.g. "bfloat16") casts on the way out."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    np_dtype = None if dtype is None else np.dtype(ml_dtypes.bfloat16 if str(dtype) == "bfloat16" else dtype)
    specs = specs_for(state, config)
    flat = dict(nnx.to_flat_state(state))
    dtypes = {s.hf_name: np_dtype or np.dtype(flat[s.path].get_value().dtype) for s in specs}
    shards = _plan_shards(specs, dtypes, shard_bytes)
    names = [_shard_name(i, len(shards)) for i in range(len(shards))]
    writers = iter(_ShardWriter(out / n, group, dtypes) for n, group in zip(names, shards))
    writer = next(writers)
    for bucket in hf_buckets(state, config, bucket_bytes, np_dtype):
        for name, array in bucket:
            if writer.done:
                writer = next(writers)
            writer.write(name, array)
    if len(shards) > 1:
        weight_map = {s.hf_name: n for n, group in zip(names, shards) for s in group}
        total = sum(int(np.prod(s.hf_shape)) * dtypes[s.hf_name].itemsize for s in specs)
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    hf_config = config.to_hf() | {"dtype": str(next(iter(set(dtypes.values()))))}
    (out / "config.json").write_text(json.dumps(hf_config, indent=2))
    if src_dir is not None:
        for f in TOKENIZER_FILES:
            if (Path(src_dir) / f).exists():
                shutil.copyfile(Path(src_dir) / f, out / f)
    return out


def _shard_name(i: int, n: int) -> str:
    return "model.safetensors" if n == 1 else f"model-{i + 1:05d}-of-{n:05d}.safetensors"


def _plan_shards(specs, dtypes, shard_bytes) -> list[list[ParamSpec]]:
    shards, size = [[]], 0
    for s in specs:
        n = int(np.prod(s.hf_shape)) * dtypes[s.hf_name].itemsize
        if shards[-1] and size + n > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(s)
        size += n
    return shards


def safetensors_header(tensors: Sequence[tuple[str, np.dtype, tuple[int, ...]]]) -> bytes:
    """Length prefix + JSON header of a safetensors file holding `tensors` back to back, in order."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, dtype, shape in tensors:
        n = int(np.prod(shape)) * np.dtype(dtype).itemsize
        header[name] = {"dtype": _CODES[np.dtype(dtype)], "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


class _ShardWriter:
    """A safetensors file whose header is written first; tensors must then arrive in spec order."""

    def __init__(self, path: Path, specs: list[ParamSpec], dtypes):
        self.expected = [s.hf_name for s in specs]
        self.f = open(path, "wb")
        self.f.write(safetensors_header([(s.hf_name, dtypes[s.hf_name], s.hf_shape) for s in specs]))

    @property
    def done(self) -> bool:
        return not self.expected

    def write(self, name: str, array: np.ndarray) -> None:
        if name != self.expected[0]:
            raise RuntimeError(f"export wrote {name} where {self.expected[0]} was planned")
        self.f.write(np.ascontiguousarray(array).reshape(-1).view(np.uint8).data)
        self.expected.pop(0)
        if self.done:
            self.f.close()
