"""One bounded HTTP call, for the clients of the VM's server and of a browser's DevTools."""

from __future__ import annotations

import urllib.error
import urllib.request

from envs.types import EnvError


class StatusError(EnvError):
    """The server answered with an HTTP error status (`code`)."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


def call(request: urllib.request.Request, timeout_s: float, limit: int) -> bytes:
    """The answer's body, refused past `limit` bytes; every failure is an EnvError."""
    what = f"{request.get_method()} {request.full_url[:200]}"
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            data = response.read(limit + 1)
    except urllib.error.HTTPError as e:
        raise StatusError(f"{what} failed: HTTP {e.code}: {e.read(500)!r}", e.code) from None
    except (urllib.error.URLError, OSError) as e:
        raise EnvError(f"{what} failed: {e}") from None
    if len(data) > limit:
        raise EnvError(f"{what}: answer over {limit} bytes")
    return data
