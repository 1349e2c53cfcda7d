"""A static web server on loopback: where task files come from in the file cache's tests."""

import functools
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest


@pytest.fixture
def web(tmp_path):
    """A static HTTP server over tmp_path/www: (base URL, folder, the paths it served)."""
    root = tmp_path / "www"
    root.mkdir()
    served = []

    class Handler(SimpleHTTPRequestHandler):
        def log_message(self, *args):
            served.append(self.path)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(root)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", root, served
    httpd.shutdown()
    httpd.server_close()
