"""absl (imported by dp-accounting and JAX) creates a logging handler on whatever ``sys.stderr`` is when it is
imported — under pytest, the session's capture file — and ``logging.shutdown`` closes every live handler's stream
unless it *is* the current ``sys.stderr``. uvicorn's ``dictConfig`` runs that shutdown each time a service starts
in a thread (:func:`labeldp.local_services.serve_in_thread`), so a test using ``capsys`` that starts one closed the
session's capture file and pytest failed at teardown ("I/O operation on closed file"). The handler writes to the
process's own stderr instead (never closed: absl leaves ``sys.__stderr__`` alone)."""

from __future__ import annotations

import sys

import absl.logging

absl.logging.get_absl_handler().python_handler.stream = sys.__stderr__
