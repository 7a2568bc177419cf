"""A lossy HTTP proxy for the tests: a real TCP server on a thread between a client and a service, which forwards
every request and relays its response — except, for the first ``times`` requests that ``matches(method, path)``
accepts, it either forwards the request and closes the client's connection instead of relaying the answer
(``mode="drop"``: the service acted, the client never hears of it) or answers 502 itself without forwarding
(``mode="fail"``: a failing gateway; the service never sees the request).

One request per connection (it asks the service to close, and so does its answer): HTTP/1.1 requests with a
``Content-Length`` body or none, which is what httpx sends here."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from urllib.parse import urlsplit

_BODY = b'{"error": {"code": "internal_error", "message": "bad gateway (test)"}}'
_BAD_GATEWAY = (b"HTTP/1.1 502 Bad Gateway\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(_BODY), _BODY))


class LossyProxy:
    def __init__(self, upstream_url: str, matches: Callable[[str, str], bool], *, times: int, mode: str = "drop"):
        assert mode in ("drop", "fail")
        parts = urlsplit(upstream_url)
        self.upstream = (parts.hostname, parts.port)
        self.matches, self.times, self.mode = matches, times, mode
        self.seen: list[tuple[str, str]] = []  # every request, in order
        self.lost = 0  # answers dropped (or failed)
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", 0))
        self._server.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self._server.getsockname()[1]}"
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="lossy-proxy", daemon=True)
        self._thread.start()

    def __enter__(self) -> LossyProxy:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._stopping.set()
        self._thread.join(5)
        self._server.close()

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                client, _ = self._server.accept()
            except OSError:
                continue
            threading.Thread(target=self._handle, args=(client,), daemon=True).start()

    def _handle(self, client: socket.socket) -> None:
        with client:
            client.settimeout(120)
            request = _read_request(client)
            if request is None:
                return
            method, path, head, body = request
            with self._lock:
                self.seen.append((method, path))
                lose = self.matches(method, path) and self.lost < self.times
                if lose:
                    self.lost += 1
            if lose and self.mode == "fail":
                client.sendall(_BAD_GATEWAY)
                return
            response = self._forward(head, body)
            if not lose:
                client.sendall(response)
            # lost: the connection closes without a byte of the answer

    def _forward(self, head: bytes, body: bytes) -> bytes:
        with socket.create_connection(self.upstream, timeout=120) as upstream:
            upstream.sendall(head + body)
            chunks = []
            while chunk := upstream.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks)


def _read_request(client: socket.socket) -> tuple[str, str, bytes, bytes] | None:
    """One request: its method, path, head (rewritten to ask for the connection's close) and body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = client.recv(65536)
        if not chunk:
            return None
        data += chunk
    raw_head, _, body = data.partition(b"\r\n\r\n")
    lines = raw_head.split(b"\r\n")
    method, path, _version = lines[0].decode("latin-1").split(" ", 2)
    headers = [line for line in lines[1:] if not line.lower().startswith((b"connection:", b"keep-alive:"))]
    length = next((int(line.split(b":", 1)[1]) for line in headers if line.lower().startswith(b"content-length:")),
                  0)
    while len(body) < length:
        chunk = client.recv(65536)
        if not chunk:
            return None
        body += chunk
    head = b"\r\n".join([lines[0], *headers, b"Connection: close"]) + b"\r\n\r\n"
    return method, path.split("?", 1)[0], head, body[:length]
