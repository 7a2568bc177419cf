"""How both parties' ``serve`` runs uvicorn: with time limits on what a client sends and a cap on connections.

uvicorn alone keeps a connection open as long as its client trickles a request head (it has a keep-alive timeout
but no header-read timeout) or a body, and answers past ``limit_concurrency`` with a plain-text 503. Here:

* **request head** — :class:`LimitedH11Protocol` closes a connection whose request head is not complete within
  ``header_timeout_seconds`` of the connection being opened (or, on a kept-alive connection, of its next request's
  first byte). A complete head is what the gatekeeper needs to admit a request (:mod:`shared.service.gate`);
* **request body** — :class:`~shared.service.limits.BodyDeadline` (ASGI middleware) times the body while the
  application waits for it: a pause over ``body_timeout_seconds``, or, after the first ``body_timeout_seconds``,
  a body arriving slower than ``min_body_bytes_per_second`` on average, is answered 408 ``body_timeout`` and the
  connection closed. Time the application spends elsewhere (admitting the request, writing what it read) is not
  counted against the client;
* **an unread body** — a request answered before its body was read (a 401, a 413, a 404 …) whose client keeps
  sending is closed ``body_timeout_seconds`` after the answer;
* **connections** — beyond ``max_connections`` open connections (or requests in progress), a request is answered
  503 ``server_busy`` with ``Retry-After`` and its connection closed.

Repeated errors are logged once per ``log_repeat_seconds`` (:mod:`shared.service.logs`).

**Several processes** (``serve --workers N``, :func:`serve_workers`): uvicorn's supervisor binds the socket once and
starts N worker processes (spawned, not forked) that share it, pings each and starts a new one for any that dies
or hangs. Each worker calls the party's ``build(settings)`` with the settings the supervisor built (environment
and flags, passed to it with uvicorn's pickled configuration, never on a command line), so it has its own context:
its own connection pool, spool directory and background threads. The limits travel the same way
(:class:`LimitedConfig`): the protocol reads them from the configuration it is made with, in every process.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import pickle
import sys
from collections.abc import Callable
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any, TypeVar

import h11
import uvicorn
from sqlalchemy.engine import make_url
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.config import STARTUP_FAILURE
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.supervisors.multiprocess import Multiprocess, Process

from shared.errors import ErrorCode, LabelDPError
from shared.service import logs
from shared.service.errors import error_response
from shared.service.limits import BodyDeadline, HttpSettings
from shared.service.scratch import default_spool_bytes

Settings = TypeVar("Settings", bound=HttpSettings)


class LimitedConfig(uvicorn.Config):
    """uvicorn's configuration with the service's HTTP limits, which :class:`LimitedH11Protocol` reads (a worker
    process receives it pickled: the limits reach every process with it)."""

    def __init__(self, app: Any, limits: HttpSettings, **options: Any) -> None:
        self.limits = limits
        super().__init__(app, http=LimitedH11Protocol, log_level="info", **options)


class LimitedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a request-head deadline, a deadline on an unread body after the answer, and a
    connection cap answered in the service's error envelope; the limits are its :class:`LimitedConfig`'s."""

    def __init__(self, config: uvicorn.Config, *args: Any, **kwargs: Any) -> None:
        if not isinstance(config, LimitedConfig):
            raise TypeError("LimitedH11Protocol runs with a LimitedConfig (it carries the HTTP limits)")
        super().__init__(config, *args, **kwargs)
        self.limits: HttpSettings = config.limits
        self._deadline: asyncio.TimerHandle | None = None
        self._deadline_for: str | None = None  # "head" or "unread_body": what the armed deadline waits for
        self.limit_concurrency = None  # uvicorn's own check answers in plain text: ours, below, in the envelope
        self._app, self.app = self.app, self._admit_connection

    async def _admit_connection(self, scope: Scope, receive: Receive, send: Send) -> None:
        cap = self.limits.max_connections
        if len(self.connections) > cap or len(self.tasks) > cap:  # both count this connection and request
            self.logger.warning("over %d connections: 503 server_busy", cap)
            busy = error_response(ErrorCode.SERVER_BUSY, "the server has too many connections; try again later")
            busy.headers["Retry-After"] = "1"  # and Connection: close, as every 5xx of the envelope
            await busy(scope, receive, send)
            return
        await self._app(scope, receive, send)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._watch()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _watch(self) -> None:
        """Arm the deadline the connection's state calls for (keeping one already running for the same thing)."""
        if self.transport.is_closing():
            self._disarm()
            return
        waiting_for = None
        if self.conn.their_state is h11.IDLE and self.conn.our_state is h11.IDLE:
            # Fresh, or kept alive: uvicorn's keep-alive timer covers an idle connection; once its next request
            # has begun (data arrived, uvicorn cancelled that timer), the head must complete in time.
            if self.timeout_keep_alive_task is None:
                waiting_for = "head"
        elif self.conn.their_state is h11.SEND_BODY and self.cycle is not None and self.cycle.response_complete:
            waiting_for = "unread_body"
        if waiting_for == self._deadline_for:
            return
        self._disarm()
        if waiting_for is not None:
            seconds = (self.limits.header_timeout_seconds if waiting_for == "head"
                       else self.limits.body_timeout_seconds)
            self._deadline, self._deadline_for = self.loop.call_later(seconds, self._expire), waiting_for

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = self._deadline_for = None

    def _expire(self) -> None:
        self._deadline = self._deadline_for = None
        if not self.transport.is_closing():
            self.transport.close()


def configure_logging() -> None:
    """The services' log format (``serve`` in the one process, and each worker process)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")


def log_storage(logger: logging.Logger, database_url: str, data_dir: str | Path) -> None:
    """Say which database and data directory ``serve`` opened (its password hidden): a service started in another
    directory opens another SQLite file, whose keys are not the ones the operator made (issue 42)."""
    shown = make_url(database_url).render_as_string(hide_password=True)
    logger.info("database %s, data directory %s", shown, Path(data_dir).resolve())


def _limited(app: ASGIApp, limits: HttpSettings) -> ASGIApp:
    return BodyDeadline(app, idle_seconds=limits.body_timeout_seconds,
                        min_bytes_per_second=limits.min_body_bytes_per_second, max_seconds=limits.max_body_seconds)


def serve(app: ASGIApp, limits: HttpSettings, *, host: str, port: int, **uvicorn_options: Any) -> None:
    """Run ``app`` (a party's, from its ``serve`` command) with these limits until the process is stopped."""
    config = LimitedConfig(_limited(app, limits), limits, host=host, port=port,
                           **uvicorn_options)  # configures uvicorn's loggers: the filter goes on after
    logs.rate_limit(logs.service_handlers(), limits.log_repeat_seconds)
    uvicorn.Server(config).run()


WORKER_HEALTHCHECK_SECONDS = 120  # how long a worker process may take to answer the supervisor's ping


def serve_workers(build: Callable[[Settings], ASGIApp], settings: Settings, *, workers: int, host: str, port: int,
                  data_dir: Path | None = None, **uvicorn_options: Any) -> int:
    """Run ``workers`` processes of the party's application on one listening socket until the supervisor is
    stopped (SIGINT, SIGTERM); each calls ``build(settings)`` — a module-level function: it is pickled by name — to
    make its own; ``data_dir``: the disk whose free space, unless ``spool_budget_bytes`` is set, the workers' spool
    budgets share (each lends its part). A worker that dies is replaced; one that refuses to start (a
    :class:`LabelDPError`) stops them all, and the exit status is then uvicorn's ``STARTUP_FAILURE`` (3), else 0.

    The supervisor pings each worker and kills one that does not answer within ``timeout_worker_healthcheck``;
    a worker answers only once it has imported the party's application, which on a loaded machine takes longer
    than uvicorn's default of 5 s — issue 40's review saw both workers killed and started again in a loop, never
    serving. Here a worker has :data:`WORKER_HEALTHCHECK_SECONDS`, and a dead one is seen dead at once
    (:class:`_Supervisor`)."""
    uvicorn_options.setdefault("timeout_worker_healthcheck", WORKER_HEALTHCHECK_SECONDS)
    settings = spool_shares(settings, workers, data_dir)
    config = LimitedConfig(functools.partial(_worker, build, settings), settings, factory=True, workers=workers,
                           host=host, port=port, **uvicorn_options)
    logs.rate_limit(logs.service_handlers(), settings.log_repeat_seconds)
    supervisor = _Supervisor(config, sockets=[config.bind_socket()])  # what uvicorn.run does for workers > 1
    supervisor.run()
    return STARTUP_FAILURE if any(p.exitcode == STARTUP_FAILURE for p in supervisor.processes) else 0


def spool_shares(settings: Settings, workers: int, data_dir: Path | None) -> Settings:
    """The workers' settings: unless ``spool_budget_bytes`` is set, each worker lends its bodies an equal part of
    the half of ``data_dir``'s free disk one process would (each taking half, N workers lent N halves: the
    twenty-seventh review, with 4 workers one organization's bodies could hold the whole disk again)."""
    if settings.spool_budget_bytes is not None or data_dir is None:
        return settings
    Path(data_dir).mkdir(parents=True, exist_ok=True)
    return settings.model_copy(update={"spool_budget_bytes": max(1, default_spool_bytes(Path(data_dir)) // workers)})


class _Supervisor(Multiprocess):
    """uvicorn's supervisor, except that a worker whose process has exited is dead without a ping: uvicorn pings
    every worker and, as the parent holds both ends of a worker's pipe, waits for a dead one's answer the whole
    healthcheck timeout — a worker that refused to start stopped the service only after 120 s, and one that died
    was replaced as late. A worker that dies while its ping waits is seen dead then too (its process's sentinel)."""

    def keep_subprocess_alive(self) -> None:
        if self.should_exit.is_set():
            return
        for index, process in enumerate(self.processes):
            if _answers(process, self.config.timeout_worker_healthcheck):
                continue
            process.kill()  # hung, or already gone
            process.join()
            if process.exitcode == STARTUP_FAILURE:  # the same in every worker: stop rather than restart in a loop
                logging.getLogger("uvicorn.error").error(
                    "Child process [%s] failed to start, stopping the parent process.", process.pid)
                self.should_exit.set()
                return
            logging.getLogger("uvicorn.error").info("Child process [%s] died", process.pid)
            replacement = Process(self.config, self.sockets)
            replacement.start()
            self.processes[index] = replacement


def _answers(process: Process, timeout: float | None) -> bool:
    """Whether a worker's process is running and answers a ping within ``timeout`` (None: however long); False
    as soon as it exits."""
    if not process.process.is_alive():
        return False
    try:
        process.parent_conn.send(b"ping")
        if process.parent_conn in wait([process.parent_conn, process.process.sentinel], timeout):
            process.parent_conn.recv()
            return True
    except (OSError, EOFError, pickle.UnpicklingError):
        pass
    return False


def _worker(build: Callable[[Settings], ASGIApp], settings: Settings) -> ASGIApp:
    """The application factory uvicorn calls in each worker process (after configuring its own loggers)."""
    configure_logging()
    try:
        app = build(settings)
    except LabelDPError as err:  # a refusal to start: the same in every worker, so not one to restart
        logging.getLogger("labeldp").error("worker process could not start: %s", err)
        sys.exit(STARTUP_FAILURE)
    logs.rate_limit(logs.service_handlers(), settings.log_repeat_seconds)
    return _limited(app, settings)
