"""A service process's scratch space under its own data directory: request bodies (raw labels among them) are
spooled there, never to the system's temporary directory, and what a crashed process left there is collected.

``<data_dir>/tmp/spool/`` holds one subdirectory per live process, ``flock``-ed by it for its lifetime. The kernel
drops a dead process's locks (kill -9 included), so a subdirectory whose lock can be taken is a crash's leftover
and is removed when a service starts, while another live process's stays. ``<data_dir>/tmp/live.lock`` is held
shared by every live process on the directory; a starting process that can hold it exclusively knows that no
other process is writing there, and only then may it collect shared leftovers (temporary files, unreferenced
outputs) — with another process live (a second server, an admin command) they may be its work in progress.
Everything under ``tmp/`` is private to the service's user: directories 0700, files 0600.

What request bodies hold in the spool directory is lent by the scratch's ``spool_budget``
(:mod:`shared.service.spool`): by default half the disk's free space when the process starts, one organization's
bodies at most half of that — the other half of the disk stays for the work of requests that are complete (label
versions, releases, the database). Several processes on one data directory each take half of what is free when
they start: give them ``spool_budget_bytes`` that add up to what the disk can spare.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import shutil
import tempfile
import weakref
from collections.abc import Iterator
from pathlib import Path

from shared.service.budgets import ByteBudget

# Temporaries of writes that rename them when done (``DataStore.write_with``'s files, the trainer's):
# ``.{name}.{uuid hex}.tmp``, never referenced.
TEMPORARY = re.compile(r"^\..+\.[0-9a-f]{32}\.tmp$")
_SPOOL, _LIVE_LOCK = "spool", "live.lock"
log = logging.getLogger("labeldp.service")


class Scratch:
    """This process's claim on ``data_dir``: ``spools`` is its own spool directory, ``spool_budget`` the bytes its
    requests' bodies may hold there — ``spool_bytes``, or half the disk's free space — waiting up to
    ``wait_seconds`` for their share (see the module docstring)."""

    def __init__(self, data_dir: str | Path, spool_bytes: int | None = None, wait_seconds: float = 10.0):
        self.root = Path(data_dir) / "tmp"
        _private_directory(self.root)
        self._live = os.open(self.root / _LIVE_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self._live, fcntl.LOCK_SH)  # waits while a starting process collects leftovers
        spools = self.root / _SPOOL
        _private_directory(spools)
        remove_dead_spools(spools)
        self.spools, spool_lock = _claim(spools)
        total = spool_bytes or default_spool_bytes(spools)
        self.spool_budget = spool_budget(total, wait_seconds)
        log.info("spool budget %s bytes%s, one organization's bodies at most half", f"{total:,}",
                 "" if spool_bytes else " (half the spool disk's free space: spool_budget_bytes unset)")
        # Released when the context holding this is collected or the interpreter exits (not after a crash: that
        # is what the next start collects).
        self._release = weakref.finalize(self, _release, self.spools, spool_lock, self._live)

    @contextlib.contextmanager
    def alone(self) -> Iterator[bool]:
        """True, and the data directory to this process for the block, if no other live process uses it."""
        try:
            fcntl.flock(self._live, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            # A failed conversion may have dropped the shared lock (flock(2)): take it again.
            fcntl.flock(self._live, fcntl.LOCK_SH)
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(self._live, fcntl.LOCK_SH)

    def remove_leftovers(self) -> int:
        """Under the data directory: every write's temporary (file or directory) and everything in ``tmp/`` but the
        spool area and the lock. Only inside ``alone()``, when it is True. Returns how many entries it removed."""
        removed = 0
        for entry in self.root.iterdir():
            if entry.name not in (_SPOOL, _LIVE_LOCK):
                removed += remove(entry)
        for directory, subdirectories, files in os.walk(self.root.parent):
            temporaries = [name for name in subdirectories + files if TEMPORARY.match(name)]
            removed += sum(remove(Path(directory) / name) for name in temporaries)
            subdirectories[:] = [name for name in subdirectories if name not in temporaries
                                 and Path(directory, name) != self.root]
        return removed

    def close(self) -> None:
        self._release()


def default_spool_bytes(directory: Path) -> int:
    """Half the free space of the disk holding ``directory``: what a process lends its bodies by default."""
    return shutil.disk_usage(directory).free // 2


def spool_budget(total: int, wait_seconds: float) -> ByteBudget:
    """The bytes bodies being spooled may hold: one body, and one organization's bodies together, at most half
    (the twenty-sixth review: with no bound, one organization's slow bodies filled the spool disk and held it while
    every other organization's writes were 507), taken 64 KiB at a time (a MiB a body let 100 bodies of 70 KiB,
    7 MiB on disk, fill an organization's 100 MiB share: the twenty-seventh)."""
    half = total // 2
    return ByteBudget(total, half, wait_seconds, per_owner=half, grain=min(SPOOL_GRAIN, max(half, 1)))


SPOOL_GRAIN = 64 << 10


def remove_dead_spools(spools: Path) -> int:
    """Remove every spool subdirectory whose lock can be taken: its process is dead."""
    removed = 0
    for entry in spools.iterdir():
        if entry.is_symlink() or not entry.is_dir():
            removed += remove(entry)
            continue
        try:
            lock = os.open(entry, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:  # another starting process removed it first
            continue
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # a live process's
            os.close(lock)
            continue
        try:
            removed += remove(entry)
        finally:
            os.close(lock)
    return removed


def _claim(spools: Path) -> tuple[Path, int]:
    """A new locked subdirectory. Another starting process may take a fresh directory's lock before its creator
    does (and remove it as dead): then the creator tries again with a new one."""
    for _attempt in range(100):
        path = Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=spools))  # mode 0700
        try:
            lock = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:
            continue
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.path.samestat(os.fstat(lock), os.stat(path)):  # still there, and the one locked
                return path, lock
        except (BlockingIOError, FileNotFoundError):
            pass
        os.close(lock)
    raise OSError(f"could not claim a spool directory under {spools}")


def _release(spools: Path, spool_lock: int, live: int) -> None:
    shutil.rmtree(spools, ignore_errors=True)
    os.close(spool_lock)
    os.close(live)


def _private_directory(path: Path) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)  # mkdir's mode does not apply to an existing directory (or passes through the umask)


def remove(path: Path) -> int:
    """Remove a file or a directory tree; counts as one entry."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
    return 1
