"""A loopback HTTP server for the download tests, with Range support (the ``server`` fixture).

The server (127.0.0.1, a free port) serves ``server.files`` (URL path → bytes) as
``server.content_types`` says (default ``application/octet-stream``), answers ``Range: bytes=a-``
and ``bytes=a-b``, records every request's path and Range header in ``server.requests``, and for a
path in ``server.drop_after`` sends only that many bytes of its first response before closing the
connection.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class LoopbackHandler(BaseHTTPRequestHandler):
    server: LoopbackServer

    def do_GET(self) -> None:
        server = self.server
        header = self.headers.get("Range")
        server.requests.append((self.path, header))
        data = server.files.get(self.path)
        if data is None:
            self.send_error(404)
            return
        start = 0
        if header is not None:
            match = re.fullmatch(r"bytes=(\d+)-(\d*)", header)
            assert match, header
            start = int(match.group(1))
            end = min(int(match.group(2) or len(data) - 1), len(data) - 1)
            if start >= len(data):
                self.send_error(416)
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        else:
            self.send_response(200)
            end = len(data) - 1
        body = data[start : end + 1]
        kind = server.content_types.get(self.path, "application/octet-stream")
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        cut = server.drop_after.pop(self.path, None)
        self.wfile.write(body if cut is None else body[:cut])
        self.wfile.flush()
        self.close_connection = True

    def log_message(self, format: str, *args: object) -> None:
        pass


class LoopbackServer(ThreadingHTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), LoopbackHandler)
        self.files: dict[str, bytes] = {}
        self.content_types: dict[str, str] = {}
        self.requests: list[tuple[str, str | None]] = []
        self.drop_after: dict[str, int] = {}

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}{path}"


@contextlib.contextmanager
def serving() -> Iterator[LoopbackServer]:
    httpd = LoopbackServer()
    thread = threading.Thread(target=httpd.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    try:
        yield httpd
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()
