"""Services on this machine, for the demo, the benchmarks and the tests: a free loopback port, an ASGI app served
by uvicorn in a background thread (fast, and the app's context can be injected), and a ``serve`` command as its
own process (what an operator runs)."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def serve_in_thread(app) -> Iterator[str]:
    """Serve ``app`` with uvicorn in a background thread on a free loopback port; yields the base URL."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=20)


@contextlib.contextmanager
def serve_process(command: list[str], base_url: str, *, env: dict | None = None, log: Path | None = None,
                  verify=True, seconds: float = 300) -> Iterator[subprocess.Popen]:
    """Run a ``serve`` command as its own process until its ``/healthz`` answers (output to ``log``, else
    discarded); yields the process and stops it on exit. ``seconds`` bounds a start that failed: a loaded machine
    took 47-55 s to start one (issue 40), and 120 s was not always enough."""
    with contextlib.ExitStack() as stack:
        output = stack.enter_context(open(log, "w")) if log is not None else subprocess.DEVNULL
        process = subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT)
        try:
            _wait_healthy(process, command, base_url, verify, seconds, log)
            yield process
        finally:
            stop_process(process, 30)


def stop_process(process: subprocess.Popen, seconds: float) -> None:
    """SIGTERM, and SIGKILL if it is still running after ``seconds``."""
    process.terminate()
    try:
        process.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _wait_healthy(process: subprocess.Popen, command: list[str], base_url: str, verify, seconds: float,
                  log: Path | None) -> None:
    where = f"; see {log}" if log is not None else ""
    name = " ".join(map(str, command[:5]))
    deadline = time.monotonic() + seconds
    while True:
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{base_url}/healthz", verify=verify, timeout=2).status_code == 200:
                return
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited{where}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name} did not start{where}")
        time.sleep(0.1)
