"""HTTP limits of both ``serve`` commands (shared/service/serving.py), with raw sockets against the real command in
its own process: a request head trickled header by header is closed at the header timeout, a body trickled byte
by byte is answered 408 ``body_timeout`` and closed, an unauthenticated body that keeps coming after its 401 is
closed, and a request beyond the connection cap is answered 503 ``server_busy`` — never the 90 s+ the review saw.

Runtime: about 32 s (four servers started, each timeout waited for once at a 2 s setting)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time

import pytest

from labeldp.local_services import free_port, serve_process

TIMEOUT = 2.0  # header and body timeouts of the servers under test (seconds)
# How long a connection is watched. Without the limits it would stay open for good (the review saw 90 s+); with
# them it closes at TIMEOUT on an idle machine, but CI's loaded 2 cores once took 5.8 s, so the upper bound only
# asserts "closed well within the watch", and the lower bounds (which load cannot break) show it was the timeout.
WATCH = TIMEOUT + 25
PARTIES = {"labels": ("LABELDP_", "admin"), "features": ("LABELDP_TRAINER_", "admin")}
POST_PATHS = {"labels": "/v1/datasets", "features": "/v1/jobs"}  # a route that reads a JSON body


@contextlib.contextmanager
def _serving(party: str, tmp, timeout: float, max_connections: int):
    prefix, role = PARTIES[party]
    env = {**os.environ, f"{prefix}DATABASE_URL": f"sqlite:///{tmp}/db.sqlite", f"{prefix}DATA_DIR": str(tmp / "data"),
           f"{prefix}HEADER_TIMEOUT_SECONDS": str(timeout), f"{prefix}BODY_TIMEOUT_SECONDS": str(timeout),
           f"{prefix}MAX_CONNECTIONS": str(max_connections)}
    cli = [sys.executable, "-m", "labeldp", party]
    key = subprocess.run(cli + ["create-key", "--org", "o", "--role", role], env=env, capture_output=True,
                         text=True, check=True).stdout.strip()
    port = free_port()
    with serve_process(cli + ["serve", "--port", str(port)], f"http://127.0.0.1:{port}", env=env,
                       log=tmp / "serve.log"):
        yield party, port, key


@pytest.fixture(scope="module", params=sorted(PARTIES))
def server(request, tmp_path_factory):
    with _serving(request.param, tmp_path_factory.mktemp(request.param), TIMEOUT, 256) as served:
        yield served


@pytest.fixture(scope="module", params=sorted(PARTIES))
def capped_server(request, tmp_path_factory):
    """Eight connections at most, and a header timeout long enough that the held connections outlive any stall
    of a loaded machine (CI once saw a 2 s timeout close them before the ninth was counted)."""
    with _serving(request.param, tmp_path_factory.mktemp(request.param), 120, 8) as served:
        yield served


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.settimeout(0.2)
    return sock


def _trickle_until_closed(sock: socket.socket, piece: bytes, seconds: float) -> tuple[float | None, bytes]:
    """Send ``piece`` every 0.2 s for up to ``seconds``: (when the server closed the connection, or None; what
    it answered)."""
    started, answer = time.monotonic(), b""
    while time.monotonic() - started < seconds:
        try:
            data = sock.recv(65536)
            if not data:
                return time.monotonic() - started, answer
            answer += data
        except TimeoutError:
            pass
        except ConnectionResetError:
            return time.monotonic() - started, answer
        with contextlib.suppress(OSError):  # a closed connection shows at the next recv
            sock.sendall(piece)
    return None, answer


def _head(method: str, path: str, *headers: str) -> bytes:
    return "\r\n".join([f"{method} {path} HTTP/1.1", "Host: test", *headers, "", ""]).encode()


def test_trickled_request_heads_are_closed_at_the_header_timeout(server):
    _, port, _ = server
    connections = [_connect(port) for _ in range(50)]  # the review's 50 unauthenticated partial heads
    for sock in connections:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: test\r\n")  # never finished: one more header every 0.2 s
    silent = _connect(port)  # and one that sends nothing at all
    closed = [_trickle_until_closed(sock, b"X-Slow: 1\r\n", WATCH)[0] for sock in connections]
    closed.append(_trickle_until_closed(silent, b"", WATCH)[0])  # past its timeout by now: closed, or soon
    assert all(t is not None for t in closed), closed
    # Each was opened before the first was watched: none is closed before the timeout.
    assert closed[0] is not None and closed[0] >= TIMEOUT - 0.3, closed


def test_a_trickled_body_is_answered_408_and_closed(server):
    party, port, key = server
    sock = _connect(port)
    sock.sendall(_head("POST", POST_PATHS[party], f"Authorization: Bearer {key}", "Content-Type: application/json",
                       "Content-Length: 100000") + b"{")
    closed, answer = _trickle_until_closed(sock, b" ", WATCH)
    assert closed is not None and closed >= TIMEOUT - 0.3, closed
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 ") and b"connection: close" in head.lower()
    assert json.loads(body)["error"]["code"] == "body_timeout"


def test_an_unread_body_after_a_401_is_closed(server):
    party, port, _ = server
    sock = _connect(port)
    sock.sendall(_head("POST", POST_PATHS[party], "Content-Type: application/json", "Content-Length: 100000") + b"{")
    closed, answer = _trickle_until_closed(sock, b" ", WATCH)
    assert answer.startswith(b"HTTP/1.1 401 ")  # answered before the body: the gate admits first
    assert closed is not None, "the unread body kept the connection open"


def test_requests_beyond_the_connection_cap_get_503_server_busy(capped_server):
    _, port, _ = capped_server
    held = [_connect(port) for _ in range(8)]  # the cap; each open (its head unfinished)
    for sock in held:
        sock.sendall(b"GET /healthz HTTP/1.1\r\n")
    # the server counts the held connections as it accepts them, which a loaded machine delays: ask until the
    # answer is the 503 (a server without the cap would answer 200 until the watch ends)
    answer = _answer_until(port, b"HTTP/1.1 503 ")
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503 ") and b"retry-after: 1" in head.lower(), answer
    assert json.loads(body)["error"]["code"] == "server_busy"
    for sock in held:
        sock.close()
    assert _answer_until(port, b"HTTP/1.1 200 ").startswith(b"HTTP/1.1 200 ")  # once it has seen them closed


def _answer_until(port: int, status_line: bytes) -> bytes:
    """A fresh connection's answer to GET /healthz, asked again until it starts with ``status_line`` (or the
    watch ends: the last answer)."""
    deadline, answer = time.monotonic() + WATCH, b""
    while time.monotonic() < deadline:
        with _connect(port) as sock:
            sock.sendall(_head("GET", "/healthz", "Connection: close"))
            _, answer = _trickle_until_closed(sock, b"", WATCH)
        if answer.startswith(status_line):
            break
        time.sleep(0.2)
    return answer
