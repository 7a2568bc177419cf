"""What a crashed labels-party process leaves under the data directory, collected when the service starts.

A file counts only once a committed row points at it (:mod:`labels_party.store.storage`), so after a crash these are
garbage: spooled request bodies of dead processes, ``.tmp`` temporaries of interrupted writes, scratch and DuckDB
spill directories under ``tmp/`` (Spark's scratch among them), privatized release files (``releases/{id}.parquet``,
a Spark job's ``releases/{id}/``) that no release row references — only versions before releases were charged
first leave those: since, a release file without its row means a database older than the data directory, which
:mod:`labels_party.runtime.recovery` refuses before this runs — and source copies (``sources/{id}/``) no dataset row
names. Jobs' attempts (a registration's copy, a release's Spark output, under ``tmp/jobs/``) of workers that died go
with the rest of ``tmp/``. All but the dead spools only when no other process uses the data directory (their work in
progress — another replica's jobs among it — looks the same: :class:`shared.service.scratch.Scratch`). Budget
vectors, coverage sets and label versions are not collected here.
"""

from __future__ import annotations

import logging
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import sessionmaker

from labels_party.store import db
from labels_party.store.storage import DataStore
from shared.service.scratch import Scratch, remove

log = logging.getLogger("labeldp.labels")


def collect(store: DataStore, sessions: sessionmaker, scratch: Scratch) -> int:
    """Remove a crash's leftovers (see the module docstring); returns how many entries were removed."""
    with scratch.alone() as alone:
        if not alone:
            return 0
        removed = scratch.remove_leftovers()
        with sessions() as session, session.begin():
            files = {Path(file).name for file in session.scalars(select(db.Release.file))}
            snapshots = {Path(s).name for s in session.scalars(select(db.Dataset.source_snapshot)) if s}
        removed += _remove_unlisted(store.path("releases"), files, lambda entry: entry.name)
        # a source copied by a registration that died before its dataset row was written
        removed += _remove_unlisted(store.path("sources"), snapshots, lambda entry: entry.name)
    if removed:
        log.info("removed %d leftover file(s) of earlier processes from the data directory", removed)
    return removed


def _remove_unlisted(directory: Path, kept: set[str], name_of) -> int:
    removed = 0
    if directory.is_dir():
        for entry in directory.iterdir():
            if name_of(entry) not in kept:
                removed += remove(entry)
    return removed
