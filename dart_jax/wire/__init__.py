"""The wire protocol every role speaks: typed msgpack messages over ZeroMQ (no JAX, no torch)."""

from dart_jax.wire.codec import WireError, decode, encode, from_bytes, to_bytes
from dart_jax.wire.config import CurveConfig, WireConfig
from dart_jax.wire.messages import PROTOCOL_VERSION, Message
from dart_jax.wire.transport import AsyncClient, Client, RemoteError, Server, WireTimeout

__all__ = ["AsyncClient", "Client", "CurveConfig", "Message", "PROTOCOL_VERSION", "RemoteError",
           "Server", "WireConfig", "WireError", "WireTimeout", "decode", "encode", "from_bytes",
           "to_bytes"]
