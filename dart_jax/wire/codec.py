"""Encoding of wire messages: a msgpack header plus one raw frame per numpy array.

A ZeroMQ message is `[header, frame_0, frame_1, ...]`. The header is the msgpack array
`[protocol_version, request_id, body]`; `body` is a tagged struct from `messages`. Every
`np.ndarray` field is written as `{"dtype", "shape", "frame"}` and its bytes travel
as frame `frame`, untouched (zero-copy both ways). Files use the same codec with arrays
inline (`{"dtype", "shape", "data"}`) so one object is one byte string.

Decoding never trusts the peer: sizes, frame indices, dtypes and byte counts are checked
and every failure is a `WireError` with a code an error reply can carry. Never pickle.
"""

from __future__ import annotations

import contextvars
from typing import Any, Sequence

import msgspec
import numpy as np

from dart_jax.wire.messages import PROTOCOL_VERSION, Message

# Dtypes allowed on the wire: plain numbers only (object arrays could smuggle code).
_DTYPES = {np.dtype(n).str: np.dtype(n) for n in (
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64")}
try:  # bf16 weights (weight sync) where ml_dtypes is installed; rollout hosts may lack it.
    import ml_dtypes
    _DTYPES["bfloat16"] = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - depends on the host
    pass
_DTYPE_NAMES = {v: ("bfloat16" if v.name == "bfloat16" else k) for k, v in _DTYPES.items()}

MAX_FRAMES = 65_536


class WireError(Exception):
    """A protocol-level failure with the error code the reply carries."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code, self.message = code, message


class _Envelope(msgspec.Struct, array_like=True):
    v: int
    rid: int
    body: Message


class _Peek(msgspec.Struct, array_like=True):
    v: int
    rid: int
    body: msgspec.Raw


_frames_out: contextvars.ContextVar[list | None] = contextvars.ContextVar("frames_out", default=None)
_frames_in: contextvars.ContextVar[Sequence | None] = contextvars.ContextVar("frames_in", default=None)


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        dtype = _DTYPE_NAMES.get(obj.dtype)
        if dtype is None:
            raise TypeError(f"dtype {obj.dtype} cannot go on the wire")
        arr = np.ascontiguousarray(obj)
        frames = _frames_out.get()
        if frames is None:
            return {"dtype": dtype, "shape": list(arr.shape), "data": arr.tobytes()}
        frames.append(memoryview(arr).cast("B") if arr.size else b"")
        return {"dtype": dtype, "shape": list(arr.shape), "frame": len(frames) - 1}
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"{type(obj).__name__} cannot go on the wire")


def _dec_hook(tp: type, obj: Any) -> Any:
    if tp is not np.ndarray:
        raise TypeError(f"unsupported type {tp}")
    if not isinstance(obj, dict) or not {"dtype", "shape"} <= obj.keys():
        raise ValueError("an array must be {dtype, shape, frame|data}")
    dtype = _DTYPES.get(obj["dtype"])
    if dtype is None:
        raise ValueError(f"dtype {obj['dtype']!r} is not allowed")
    shape = obj["shape"]
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise ValueError(f"bad array shape {shape!r}")
    buf = _array_bytes(obj)
    count = int(np.prod(shape, dtype=np.int64))
    if len(buf) != count * dtype.itemsize:
        raise ValueError(f"array {shape} {dtype} needs {count * dtype.itemsize} bytes, got {len(buf)}")
    return np.frombuffer(buf, dtype=dtype, count=count).reshape(shape)


def _array_bytes(obj: dict) -> Any:
    if "data" in obj:
        if not isinstance(obj["data"], (bytes, bytearray, memoryview)):
            raise ValueError("inline array data must be bytes")
        return obj["data"]
    frames, idx = _frames_in.get(), obj.get("frame")
    if frames is None or type(idx) is not int or not 0 <= idx < len(frames):
        raise ValueError(f"array frame {idx!r} does not exist")
    return memoryview(frames[idx])


_encoder = msgspec.msgpack.Encoder(enc_hook=_enc_hook)
_peek = msgspec.msgpack.Decoder(_Peek)
_body = msgspec.msgpack.Decoder(Message, dec_hook=_dec_hook)


def encode(body: Message, rid: int = 0) -> list:
    """Frames for one message: `[header, *array_frames]`."""
    frames: list = []
    token = _frames_out.set(frames)
    try:
        header = _encoder.encode(_Envelope(PROTOCOL_VERSION, rid, body))
    finally:
        _frames_out.reset(token)
    return [header, *frames]


def peek_rid(frames: Sequence) -> int:
    """The request id of a message, or 0 when even the header cannot be read."""
    try:
        return _peek.decode(frames[0]).rid
    except (msgspec.DecodeError, UnicodeDecodeError, IndexError, TypeError):
        return 0


def check_size(frames: Sequence, max_bytes: int) -> None:
    """Raise `too_large` for a message over `max_bytes` in all or over MAX_FRAMES frames."""
    if len(frames) > MAX_FRAMES:
        raise WireError("too_large", f"{len(frames)} frames (limit {MAX_FRAMES})")
    size = sum(len(memoryview(f)) for f in frames)
    if size > max_bytes:
        raise WireError("too_large", f"{size} bytes (limit {max_bytes})")


def decode(frames: Sequence, max_bytes: int) -> tuple[int, Message]:
    """`(request_id, body)` from received frames; raises WireError on anything wrong."""
    if not frames:
        raise WireError("bad_request", "empty message")
    check_size(frames, max_bytes)
    try:
        head = _peek.decode(frames[0])
    except (msgspec.DecodeError, UnicodeDecodeError) as e:
        raise WireError("bad_request", f"unreadable header: {e}") from None
    if head.v != PROTOCOL_VERSION:
        raise WireError("version", f"protocol {head.v}, this side speaks {PROTOCOL_VERSION}")
    token = _frames_in.set(frames[1:])
    try:
        return head.rid, _body.decode(head.body)
    except msgspec.ValidationError as e:
        code = "unknown_message" if "Invalid value" in str(e) and "$.type" in str(e) else "bad_request"
        raise WireError(code, str(e)) from None
    except (msgspec.DecodeError, UnicodeDecodeError) as e:
        raise WireError("bad_request", str(e)) from None
    finally:
        _frames_in.reset(token)


def to_bytes(obj: msgspec.Struct) -> bytes:
    """One self-contained msgpack byte string (arrays inline), for files and blobs."""
    return _encoder.encode(obj)


def from_bytes(data: bytes, tp: type) -> Any:
    """Inverse of `to_bytes` for a struct type `tp`; raises WireError when malformed."""
    try:
        return msgspec.msgpack.decode(data, type=tp, dec_hook=_dec_hook)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as e:
        raise WireError("bad_request", f"{tp.__name__}: {e}") from None
