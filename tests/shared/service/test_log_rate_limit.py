"""Repeated errors are logged once per interval with a count (shared/service/logs.py): the filter on its own, and a
labels service whose descriptors run out (RLIMIT_NOFILE lowered) — asyncio logs every failed accept with its
traceback, 14 MB in 5 s without the filter on this machine.

Runtime: about 10 s (one server started, descriptors exhausted for 3 s)."""

from __future__ import annotations

import logging
import os
import re
import resource
import socket
import sys
import time

from labeldp.local_services import free_port, serve_process
from shared.service.logs import RepeatFilter


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _record(message: str, level: int = logging.ERROR, name: str = "asyncio", exc: bool = True) -> logging.LogRecord:
    exc_info = (OSError, OSError(24, "Too many open files"), None) if exc else None
    return logging.LogRecord(name, level, __file__, 1, message, None, exc_info)


def test_identical_errors_are_collapsed_per_interval_with_their_count():
    clock = _Clock()
    repeat = RepeatFilter(10.0, clock)
    accept = "socket.accept() out of system resource\nsocket: <fd=6>"
    assert repeat.filter(_record(accept))  # the first is logged
    passed = [repeat.filter(_record(accept)) for _ in range(500)]
    assert not any(passed)  # the 500 repetitions within 10 s are not
    assert repeat.filter(_record("another error"))  # another message is its own burst
    assert repeat.filter(_record(accept, name="uvicorn.error"))  # so is another logger's
    assert repeat.filter(_record(accept, exc=False))  # and another exception (none)
    assert repeat.filter(_record(accept, level=logging.INFO))  # below WARNING nothing is collapsed
    assert repeat.filter(_record(accept, level=logging.INFO))
    clock.now = 10.5
    summary = _record(accept)
    assert repeat.filter(summary)  # the first after the interval carries the count, on its first line
    assert summary.getMessage().split("\n")[0] == \
        "socket.accept() out of system resource (… repeated 500 times in the last 10 s)"
    assert not repeat.filter(_record(accept))
    # The same record at a second handler gets the same answer (not counted as a repetition of itself).
    clock.now = 30
    twice = _record("once")
    assert repeat.filter(twice) and repeat.filter(twice)


def test_descriptor_exhaustion_does_not_flood_the_log(tmp_path):
    env = {**os.environ, "LABELDP_DATABASE_URL": f"sqlite:///{tmp_path}/db.sqlite",
           "LABELDP_DATA_DIR": str(tmp_path / "data"), "LABELDP_LOG_REPEAT_SECONDS": "1",
           "LABELDP_HEADER_TIMEOUT_SECONDS": "60", "LABELDP_MAX_CONNECTIONS": "10000"}
    log = tmp_path / "serve.log"
    port = free_port()

    command = [sys.executable, "-m", "labeldp", "labels", "serve", "--port", str(port)]
    with serve_process(command, f"http://127.0.0.1:{port}", env=env, log=log) as process:
        open_now = len(os.listdir(f"/proc/{process.pid}/fd"))
        # 50 more descriptors than the started server holds: soon exhausted by idle connections
        resource.prlimit(process.pid, resource.RLIMIT_NOFILE, (open_now + 50, open_now + 50))
        started_size = log.stat().st_size
        held, started = [], time.monotonic()
        while time.monotonic() - started < 3:  # connect for 3 s: the first ~50 are accepted, then accept fails
            try:
                held.append(socket.create_connection(("127.0.0.1", port), timeout=1))
            except OSError:
                time.sleep(0.01)
            if len(held) > 1500:  # the kernel's backlog is full too; keep the server failing accepts
                time.sleep(0.01)
        grown = log.stat().st_size - started_size
        for sock in held:
            sock.close()
    text = log.read_text()
    assert "socket.accept() out of system resource" in text  # the descriptors did run out
    counts = [int(n) for n in re.findall(r"repeated (\d+) times", text)]
    assert counts and max(counts) > 100, counts  # many failed accepts, summarized
    assert grown < 50_000, grown  # a few records a second, not megabytes
