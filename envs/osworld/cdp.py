"""Chrome's DevTools HTTP endpoints, from the host: the tabs of the guest's browser.

OSWorld's `chrome_open_tabs` and `chrome_close_tabs` setup steps drive the browser in the
VM through its remote-debugging port (9222 in the guest; `provider: qemu` forwards it to a
loopback port of the host, envs/osworld/qemu.py). The tab calls are DevTools' HTTP
endpoints: `/json/version` (is it up), `/json/list` (the targets), `PUT /json/new?URL`
(a tab), `/json/close/ID`. Answers are bounded and checked; failures are EnvErrors.
"""

from __future__ import annotations

import json
import time
import urllib.request
from urllib.parse import quote, urlsplit, urlunsplit

from envs.osworld import httpcall
from envs.types import EnvError

MAX_ANSWER_BYTES = 4 << 20


class DevTools:
    """The DevTools endpoints at `url` (http://HOST:PORT)."""

    def __init__(self, url: str, timeout_s: float = 30.0):
        self.url, self.timeout_s = url.rstrip("/"), timeout_s

    def wait(self, timeout_s: float) -> None:
        """Until the browser answers (it may still be starting after a `launch` step)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self._json("GET", "/json/version")
                return
            except EnvError:
                if time.monotonic() > deadline:
                    raise EnvError(f"no browser answered on {self.url} within {timeout_s:g} s") from None
                time.sleep(0.5)

    def tabs(self) -> list[dict]:
        """The open tabs (page targets), each {"id", "url", ...}, in the browser's order."""
        targets = self._json("GET", "/json/list")
        if not isinstance(targets, list):
            raise EnvError(f"{self.url}/json/list: expected a list")
        return [t for t in targets if isinstance(t, dict) and t.get("type") == "page"
                and isinstance(t.get("id"), str) and isinstance(t.get("url"), str)]

    def open(self, url: str) -> dict:
        tab = self._json("PUT", "/json/new?" + quote(url, safe=":/?&=%@+,;~"))
        if not isinstance(tab, dict) or not isinstance(tab.get("id"), str):
            raise EnvError(f"{self.url}/json/new: no target in the answer")
        return tab

    def close(self, target_id: str) -> None:
        """Close a tab and wait until the browser no longer lists it (closing is asynchronous)."""
        self._call("GET", "/json/close/" + quote(target_id, safe=""))
        deadline = time.monotonic() + self.timeout_s
        while any(t["id"] == target_id for t in self.tabs()):
            if time.monotonic() > deadline:
                raise EnvError(f"{self.url}: tab {target_id} still open {self.timeout_s:g} s after closing it")
            time.sleep(0.05)

    def _json(self, method: str, path: str):
        answer = self._call(method, path)
        try:
            return json.loads(answer)
        except ValueError as e:
            raise EnvError(f"{method} {self.url}{path[:200]}: not JSON ({e})") from None

    def _call(self, method: str, path: str) -> bytes:
        request = urllib.request.Request(self.url + path, method=method)
        return httpcall.call(request, self.timeout_s, MAX_ANSWER_BYTES)


def same_url(a: str, b: str) -> bool:
    """OSWorld's URL comparison: scheme (http when absent) and host lowercased, "www."
    dropped from the host, a lone "/" path dropped."""
    return _normal(a) == _normal(b)


def _normal(url: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(scheme=(parts.scheme or "http").lower(),
                                     netloc=parts.netloc.lower().replace("www.", ""),
                                     path="" if parts.path == "/" else parts.path))
