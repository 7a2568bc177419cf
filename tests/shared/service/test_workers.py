"""``labeldp labels|features serve --workers N``: refused on SQLite before anything starts (one line, exit status
2); a worker that refuses to start stops the supervisor (exit status 3) instead of being restarted in a loop; and,
on PostgreSQL (slow), two worker processes share the port: both answer requests, each with the HTTP limits, a
killed worker is replaced, ``/readyz`` answers 200 throughout, and TLS works with workers."""

from __future__ import annotations

import http.client
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from labeldp.local_services import free_port, serve_process
from shared.service.sealing import write_key_file
from tests.shared.service.test_tls import _certificate
from tests.support.databases import POSTGRES_URL, fresh_database
from tests.support.workers import holder_of_connection, worker_pids

ROOT = Path(__file__).resolve().parents[3]
PREFIX = {"labels": "LABELDP_", "features": "LABELDP_TRAINER_"}
# Longer than the default header timeout (10 s), so that the connection's closing no earlier than this — a lower
# bound, which load cannot break — shows the workers use the configured limit, not the default. The connection is
# watched while the rest of the test runs.
HEADER_TIMEOUT = 13.0
DEFAULT_HEADER_TIMEOUT = 10.0


@pytest.mark.parametrize("party", sorted(PREFIX))
def test_workers_on_sqlite_are_refused_before_anything_starts(tmp_path, party):
    env = {k: v for k, v in os.environ.items() if not k.startswith("LABELDP_")}  # the default database: SQLite
    done = subprocess.run([sys.executable, "-m", "labeldp", party, "serve", "--workers", "2", "--port",
                           str(free_port())], capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env)
    assert done.returncode == 2, done
    assert done.stderr.splitlines() == [
        "labeldp: error: --workers 2 needs a PostgreSQL database (--database-url); SQLite serves one process: use "
        "--workers 1"], done.stderr
    assert done.stdout == "" and list(tmp_path.iterdir()) == []  # not even the SQLite file's directory


@pytest.mark.parametrize("workers", ["0", "-1", "two"])
def test_workers_is_a_positive_number(tmp_path, workers):
    done = subprocess.run([sys.executable, "-m", "labeldp", "labels", "serve", "--workers", workers],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done
    assert "argument --workers: a whole number of processes, at least 1" in done.stderr


def test_a_worker_that_refuses_to_start_stops_the_supervisor(tmp_path):
    """Every worker would refuse the same way: uvicorn's supervisor stops on the first (exit status 3) rather
    than start a new one every half second."""
    script = ("import sys; from shared.service.limits import HttpSettings; "
              "from shared.service.serving import serve_workers; from tests.support.workers import refuse_to_start; "
              f"sys.exit(serve_workers(refuse_to_start, HttpSettings(), workers=2, host='127.0.0.1', "
              f"port={free_port()}))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 3, done.stderr[-3000:]
    assert "worker process could not start: this worker refuses to start" in done.stderr
    assert "failed to start, stopping the parent process" in done.stderr
    # not restarted in a loop: each of the two workers started once at most (not a stopwatch: a loaded machine
    # may take long to start them)
    assert done.stderr.count("this worker refuses to start") <= 2, done.stderr[-3000:]


def _exit_without_answering(seconds: float) -> None:
    time.sleep(seconds)


def test_a_worker_that_dies_while_its_ping_waits_is_seen_dead():
    """uvicorn's supervisor waited its whole healthcheck timeout (120 s) for the answer of a worker that died after
    the ping was sent, as the parent holds both ends of the pipe (2 minutes of CI when a refusing worker exited
    under load). With no timeout at all, the check must still end when the process does."""
    import multiprocessing
    from types import SimpleNamespace

    from shared.service.serving import _answers

    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    process = context.Process(target=_exit_without_answering, args=(0.5,))
    process.start()
    answered: list[bool] = []
    check = threading.Thread(target=lambda: answered.append(_answers(SimpleNamespace(
        process=process, parent_conn=parent), timeout=None)), daemon=True)
    check.start()
    check.join(300)  # bounds a failure (the old check never returns), not a speed
    process.join()
    assert answered == [False]
    child.close()


def _request(port: int, tls: ssl.SSLContext | None) -> tuple[http.client.HTTPConnection, int]:
    """A kept-alive connection that has been answered 200 on /readyz, and its client port."""
    connection = (http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=tls) if tls
                  else http.client.HTTPConnection("127.0.0.1", port, timeout=10))
    connection.request("GET", "/readyz")
    answer = connection.getresponse()
    body = answer.read()
    assert answer.status == 200, body
    assert body.startswith(b'{"status":"ready"'), body
    assert connection.sock is not None
    return connection, connection.sock.getsockname()[1]


def _answering_workers(port: int, pids: set[int], tls: ssl.SSLContext | None, *, until: set[int]) -> set[int]:
    """Open connections (kept open, so that workers keep their share) until each of ``until`` has answered one;
    the workers that answered."""
    answered: set[int] = set()
    connections = []
    try:
        for _ in range(200):
            connection, client_port = _request(port, tls)
            connections.append(connection)
            holder = holder_of_connection(port, client_port, pids)
            assert holder is not None, "no worker holds the connection"
            answered.add(holder)
            if until <= answered:
                break
    finally:
        for connection in connections:
            connection.close()
    return answered


def _wait_for(condition, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"not within {seconds} s: {what}")


class _UnfinishedHead:
    """A connection whose request head never completes, watched from a thread: when the server closed it."""

    def __init__(self, port: int, tls: ssl.SSLContext | None) -> None:
        raw = socket.create_connection(("127.0.0.1", port), timeout=300)  # a bound for a failure, not a speed
        self.sock = tls.wrap_socket(raw, server_hostname="127.0.0.1") if tls else raw
        self.client_port = self.sock.getsockname()[1]
        self.started = time.monotonic()
        self.sock.sendall(b"GET /readyz HTTP/1.1\r\nHost: t\r\n")  # never finished
        self.closed_after: float | None = None
        self._watch = threading.Thread(target=self._wait, daemon=True)
        self._watch.start()

    def _wait(self) -> None:
        try:
            data = self.sock.recv(1024)
        except (ConnectionResetError, ssl.SSLError):
            data = b""
        if data == b"":
            self.closed_after = time.monotonic() - self.started

    def result(self) -> float | None:
        """Seconds until the server closed it (None: it answered something, or was not closed)."""
        self._watch.join(300)
        self.sock.close()
        return self.closed_after


@pytest.mark.slow
@pytest.mark.skipif(not POSTGRES_URL, reason="set LABELDP_TEST_POSTGRES_URL to run several workers on PostgreSQL")
@pytest.mark.parametrize(("party", "https"), [("labels", True), ("features", False)])
def test_two_workers_serve_on_postgresql(tmp_path, party, https):
    prefix = PREFIX[party]
    port = free_port()
    flags, tls = [], None
    if https:
        cert, key = _certificate(tmp_path)
        flags, tls = ["--ssl-certfile", cert, "--ssl-keyfile", key], ssl.create_default_context(cafile=cert)
    write_key_file(tmp_path / "secret.key")  # workers run each other's jobs: one shared key (required)
    env = {**os.environ, f"{prefix}HEADER_TIMEOUT_SECONDS": str(HEADER_TIMEOUT),
           f"{prefix}SECRET_KEY_FILE": str(tmp_path / "secret.key")}
    with fresh_database("postgresql", tmp_path) as url:
        command = [sys.executable, "-m", "labeldp", party, "serve", "--workers", "2", "--port", str(port),
                   "--database-url", url, "--data-dir", str(tmp_path / "data"), *flags]
        scheme = "https" if https else "http"
        with serve_process(command, f"{scheme}://127.0.0.1:{port}", env=env, log=tmp_path / "serve.log",
                           verify=tls or True) as supervisor:
            first = _wait_for(lambda: (lambda pids: pids if len(pids) == 2 else None)(worker_pids(supervisor.pid)),
                              60, "two worker processes")
            # the HTTP limits reached the workers (their protocol reads them from the pickled configuration): a
            # head never finished is closed, not before the configured timeout, which is longer than the default
            unfinished = _UnfinishedHead(port, tls)
            watched = _wait_for(lambda: holder_of_connection(port, unfinished.client_port, first), 60,
                                "the worker holding the unfinished head")
            # both answer (the kernel hands each new connection to one of them), every answer a 200 /readyz
            assert _answering_workers(port, first, tls, until=first) == first
            # a worker that dies is replaced by the supervisor, and the new one answers too (the other worker keeps
            # the unfinished head)
            killed = min(first - {watched})
            os.kill(killed, signal.SIGKILL)
            second = _wait_for(lambda: (lambda pids: pids if len(pids) == 2 and killed not in pids else None)(
                worker_pids(supervisor.pid)), 180, "a new worker in place of the killed one")
            (replacement,) = second - first
            _wait_for(lambda: replacement in _answering_workers(port, second, tls, until=second), 180,
                      "the new worker answering")
            closed_after = unfinished.result()
            assert closed_after is not None and closed_after >= HEADER_TIMEOUT - 0.5 > DEFAULT_HEADER_TIMEOUT, \
                closed_after
        assert supervisor.returncode == 0, (tmp_path / "serve.log").read_text()[-3000:]
        for pid in second:  # the supervisor stopped its workers before it exited
            assert not Path(f"/proc/{pid}").exists()
