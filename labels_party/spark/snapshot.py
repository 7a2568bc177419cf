"""A source dataset's immutable copy: what its owner registered, taken once, and the only thing Spark ever reads.

Spark reads local files through Hadoop, which follows symbolic links, and a location checked at one moment and
opened by Spark at another is a race: an organization could swap a file it registered for a link into another
organization's directory after the check and be released (and shown the histogram of) the other's labels. So a
source is copied when it is registered, into ``sources/<dataset id>/`` under the service's data directory, and
its histogram and every release read that copy.

The copy is taken by file descriptors, never by path: the operator's prefix is opened once (its real path: the
operator's configuration is trusted), then every path component below it with ``O_NOFOLLOW`` relative to its
directory's descriptor, and each file is read from the descriptor that was opened and ``fstat``-checked. A
symbolic link anywhere under the source (or on the way to it from the prefix), a FIFO, a device or a socket is
refused, and no path is ever resolved again after its check, so no swap can make the copy read another file. A
file whose size, modification or change time moved while it was copied is refused (written to while copied).

Names starting with ``_`` or ``.`` are skipped, unopened, as Spark skips them (``_SUCCESS``, ``_spark_metadata``,
``.crc`` files). A hard link is a file of the directory it is in: the kernel lets a user link only files it may
read and write itself (``fs.protected_hardlinks``), so it reaches nothing its owner could not copy.

Only local sources (a path or a ``file:`` URI) can be copied this way. Object stores and HDFS are refused: there
a versioned listing (object versions, HDFS snapshots) would pin what was checked; it is not built.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import stat
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from shared.errors import ErrorCode, LabelDPError, resource_error
from shared.service.storage_quota import BLOCK

SNAPSHOTS = "sources"  # under the data directory: sources/<dataset id>/, the files as registered
_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # NONBLOCK: opening a FIFO must not hang
_CHUNK = 1 << 20
_MAX_DEPTH = 32  # partition directories below the source (Spark's partitioned layouts use a few)
MAX_ENTRIES = 100_000  # files and directories a source may hold (each an inode of the copy; Spark lists them all)


@dataclass
class Room:
    """What a copy may still take of its organization's quota (None: no bound) and the entries it has made: the
    copy stops, and is removed, at either limit — not only once it is placed (issue 40's 33rd review: a source that
    grew after its registration's request was copied whole, 3.08 times the quota from one request; 20,000 empty
    directories took 82.4 MB and 20,003 inodes)."""

    left: int | None = None
    entries: int = 0

    def take(self, nbytes: int, source: str, *, entry: bool = False) -> None:
        if entry:
            self.entries += 1
            if self.entries > MAX_ENTRIES:
                raise LabelDPError(f"the source {source!r} holds more than {MAX_ENTRIES:,} files and directories",
                                   code=ErrorCode.MALFORMED_FILE)
        if self.left is not None:
            self.left -= nbytes
            if self.left < 0:
                raise LabelDPError(f"copying the source {source!r} would take its organization over its storage "
                                   "quota on this service (its size grew since the request, or other data took the "
                                   "room); nothing was registered", code=ErrorCode.STORAGE_QUOTA_EXCEEDED)


@dataclass(frozen=True)
class SnapshotFile:
    path: str  # relative to the snapshot (and to the source), "/"-separated
    size: int
    sha256: str


@dataclass(frozen=True)
class SourceSnapshot:
    location: str  # relative to the data directory
    files: tuple[SnapshotFile, ...]
    sha256: str  # of every file's path, size and content digest: the dataset's identity


def local_path(uri: str) -> str | None:
    """The path of a local source (a path or a ``file:`` URI on this host), else None."""
    parsed = urlparse(uri)
    if parsed.scheme == "":
        return uri
    if parsed.scheme == "file" and parsed.netloc in ("", "localhost") and not (parsed.query or parsed.fragment):
        return parsed.path
    return None


def locate(source: str, prefixes: Sequence[str]) -> tuple[str, list[str]]:
    """(the allowed prefix's real path, the source's path components below it), or ``source_not_allowed``."""
    path = local_path(source)
    if path is None:
        raise LabelDPError("only local sources (a path or a file: URI) can be registered: the service copies a source "
                           "when it is registered; object stores and HDFS are not supported",
                           code=ErrorCode.SOURCE_NOT_ALLOWED)
    parts = _components(path)
    for prefix in prefixes:
        prefix_path = local_path(prefix)
        if prefix_path is None:
            continue
        base = _components(prefix_path)
        if parts[:len(base)] == base and os.path.isabs(prefix_path) and os.path.isabs(path):
            return os.path.realpath(prefix_path), parts[len(base):]
    raise LabelDPError("this source location is not one this organization may register",
                       code=ErrorCode.SOURCE_NOT_ALLOWED)


def _components(path: str) -> list[str]:
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise LabelDPError("a source location cannot name a parent directory", code=ErrorCode.SOURCE_NOT_ALLOWED)
    return parts


def expected_size(source: str) -> int:
    """What a copy of the (local, allowed) ``source`` will take, as :func:`copy` keeps it: its files Spark reads (names
    starting with ``_`` or ``.`` skipped) and the directories holding them, at least a block each; no link followed.
    Over :data:`MAX_ENTRIES` entries it is refused here, before any lock is taken (issue 40's 34th review: the walk
    of 300,000 entries under SQLite's write lock held every organization's writes for 1.2 s a request). A source
    that is missing or unreadable is left to the registration's job (0 here)."""
    path = local_path(source)
    if path is None:
        return 0
    room = Room()

    def walk(directory: str, depth: int) -> int:
        if depth > _MAX_DEPTH:
            return 0  # refused by the copy
        total = 0
        try:
            with os.scandir(directory) as listing:
                for entry in listing:
                    room.take(0, source, entry=True)
                    if entry.name.startswith(("_", ".")):
                        continue
                    if entry.is_file(follow_symlinks=False):
                        total += entry.stat(follow_symlinks=False).st_size + BLOCK
                    elif entry.is_dir(follow_symlinks=False):
                        below = walk(entry.path, depth + 1)
                        total += below + BLOCK if below else 0
        except OSError:
            return total
        return total

    try:
        if os.path.isfile(path) and not os.path.islink(path):
            return os.lstat(path).st_size + BLOCK
    except OSError:
        return 0
    return walk(path, 0)


def take(source: str, prefixes: Sequence[str], data_dir: Path, dataset_id: str,
         checkpoint: Callable[[str], None] = lambda _name: None) -> SourceSnapshot:
    """Copy ``source`` (under one of ``prefixes``) to ``sources/<dataset_id>/`` under ``data_dir``, or refuse and
    leave nothing behind: :func:`copy` then :func:`place`."""
    copied = copy(source, prefixes, data_dir, dataset_id, checkpoint)
    try:
        return place(data_dir, copied)
    except BaseException:
        discard(copied)
        raise


@dataclass(frozen=True)
class Copy:
    """A source copied into a temporary directory of the data directory (``<id>.<hex>.copy``, under ``sources/``
    or the caller's scratch directory — not a hidden name: Spark warns about reading one): what its registration
    counts, then :func:`place`-s as the dataset's snapshot (or :func:`discard`-s)."""

    dataset_id: str
    temporary: Path
    location: str  # the temporary directory, relative to the data directory
    files: tuple[SnapshotFile, ...]
    sha256: str


def copy(source: str, prefixes: Sequence[str], data_dir: Path, dataset_id: str,
         checkpoint: Callable[[str], None] = lambda _name: None, into: Path | None = None,
         room: int | None = None) -> Copy:
    """Copy ``source`` (under one of ``prefixes``) into a fresh temporary directory (each call its own: a
    registration taken over copies again from scratch), or refuse and leave nothing behind. ``checkpoint`` is
    called with ``"source_listed"`` once a directory was listed (before its entries are opened) and
    ``"source_opened"`` once a file was opened and checked (before it is copied): tests change the source there.
    ``into``: the directory the temporary goes in (on the data directory's file system; default ``sources/``).
    ``room``: the bytes the copy may take (:class:`Room`); empty directories are not kept."""
    prefix, parts = locate(source, prefixes)
    parent = into if into is not None else Path(data_dir) / SNAPSHOTS
    parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    temporary = parent / f"{dataset_id}.{uuid.uuid4().hex}.copy"
    temporary.mkdir(mode=0o700)
    try:
        files = _copy_source(prefix, parts, temporary, source, checkpoint, Room(room))
        if not files:
            raise LabelDPError("the source holds no files (names starting with _ or . are skipped, as Spark does)",
                               code=ErrorCode.EMPTY_LABELS)
        _fsync_directory(temporary)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    digest = hashlib.sha256()
    for file in files:
        digest.update(f"{file.path}\t{file.size}\t{file.sha256}\n".encode())
    return Copy(dataset_id, temporary, str(temporary.relative_to(data_dir)), tuple(files), digest.hexdigest())


def place(data_dir: Path, copied: Copy) -> SourceSnapshot:
    """The copy renamed to ``sources/<dataset id>/``, durably. What is there already is an earlier attempt's that
    died after its rename and before its dataset row said so (the caller holds the registration's lease): it goes."""
    root = Path(data_dir) / SNAPSHOTS
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    target = root / copied.dataset_id
    if target.exists():
        shutil.rmtree(target)
    os.rename(copied.temporary, target)
    _fsync_directory(root)
    return SourceSnapshot(f"{SNAPSHOTS}/{copied.dataset_id}", copied.files, copied.sha256)


def discard(copied: Copy) -> None:
    shutil.rmtree(copied.temporary, ignore_errors=True)


def remove(data_dir: Path, location: str) -> None:
    shutil.rmtree(Path(data_dir) / location, ignore_errors=True)


def _copy_source(prefix: str, parts: list[str], target: Path, source: str,
                 checkpoint: Callable[[str], None], room: Room) -> list[SnapshotFile]:
    try:
        fd = os.open(prefix, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as err:
        raise resource_error(err) or LabelDPError(
            "this organization's source directory cannot be read on this service",
            code=ErrorCode.SOURCE_NOT_ALLOWED) from None
    try:
        for index, name in enumerate(parts):  # down to the source, one component at a time, no link followed
            below = _open(fd, name, "/".join(parts[:index + 1]), source)
            os.close(fd)
            fd = below
            if index < len(parts) - 1 and not stat.S_ISDIR(os.fstat(fd).st_mode):
                raise _not_found()
        mode = os.fstat(fd).st_mode
        if stat.S_ISREG(mode):  # a single file (never the prefix, opened as a directory): copied under its name
            return [_copy_file(fd, target / parts[-1], parts[-1], source, checkpoint, room)]
        _refuse_unless_directory(mode, source, source)
        files: list[SnapshotFile] = []
        _copy_directory(fd, target, "", source, checkpoint, files, room)
        return files
    finally:
        os.close(fd)


def _copy_directory(fd: int, target: Path, relative: str, source: str, checkpoint: Callable[[str], None],
                    files: list[SnapshotFile], room: Room) -> None:
    if relative.count("/") >= _MAX_DEPTH:  # one open descriptor and one stack frame per level
        raise LabelDPError(f"the source {source!r} nests directories deeper than {_MAX_DEPTH}",
                           code=ErrorCode.MALFORMED_FILE)
    with os.scandir(fd) as listing:
        names = sorted(entry.name for entry in listing if not entry.name.startswith(("_", ".")))
    checkpoint("source_listed")
    for name in names:
        path = f"{relative}{name}"
        child = _open(fd, name, path, source)
        try:
            mode = os.fstat(child).st_mode
            if stat.S_ISREG(mode):
                files.append(_copy_file(child, target / name, path, source, checkpoint, room))
                continue
            _refuse_unless_directory(mode, path, source)
            room.take(BLOCK, source, entry=True)
            (target / name).mkdir(mode=0o700)
            held = len(files)
            _copy_directory(child, target / name, f"{path}/", source, checkpoint, files, room)
            if len(files) == held:  # no file under it: Spark reads nothing there, and the copy keeps nothing
                (target / name).rmdir()
                room.take(-BLOCK, source)
        finally:
            os.close(child)


def _open(directory: int, name: str, path: str, source: str) -> int:
    """``name`` in ``directory``, itself and not what a link names."""
    try:
        return os.open(name, _OPEN, dir_fd=directory)
    except OSError as err:
        resource = resource_error(err)  # out of descriptors or memory: the service's, not the source's (503)
        if resource is not None:
            raise resource from None
        if err.errno == errno.ELOOP:
            raise LabelDPError(f"{path!r} (at the source location {source!r}) is a symbolic link; a source may "
                               f"hold only directories and regular files", code=ErrorCode.SOURCE_NOT_ALLOWED) from None
        raise _not_found() from None  # missing, vanished while it was copied, or unreadable: all one answer


def _not_found() -> LabelDPError:
    """A source (or a path in it) that is missing, vanished while it was copied, unreadable or below a file. The
    message names no path, not even the part the request gave: which server paths exist is not the client's to
    learn, nor to have echoed back cut at a comma."""
    return LabelDPError("the source location does not exist or is not readable", code=ErrorCode.SOURCE_NOT_FOUND)


def _refuse_unless_directory(mode: int, path: str, source: str) -> None:
    if not stat.S_ISDIR(mode):  # a FIFO, socket or device: not a file Spark should read
        raise LabelDPError(f"{path!r} (at the source location {source!r}) is neither a directory nor a regular file",
                           code=ErrorCode.SOURCE_NOT_ALLOWED)


def _copy_file(fd: int, target: Path, path: str, source: str, checkpoint: Callable[[str], None],
               room: Room) -> SnapshotFile:
    """Copy the opened file's bytes, hashing them; refuse if it changed meanwhile (size, modification or change
    time: the change time moves with any write or unlink, and no user can set it back)."""
    before = os.fstat(fd)
    checkpoint("source_opened")
    digest, size = hashlib.sha256(), 0
    room.take(BLOCK, source, entry=True)
    out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        while chunk := os.read(fd, _CHUNK):
            room.take(len(chunk), source)
            digest.update(chunk)
            size += len(chunk)
            view = memoryview(chunk)
            while view:
                view = view[os.write(out, view):]
        os.fsync(out)
    finally:
        os.close(out)
    after = os.fstat(fd)
    if size != before.st_size or _times(before) != _times(after):
        raise LabelDPError(f"{path!r} (at the source location {source!r}) changed while it was copied; register "
                           f"it again once it is written", code=ErrorCode.SOURCE_NOT_ALLOWED)
    return SnapshotFile(path, size, digest.hexdigest())


def _times(status: os.stat_result) -> tuple[int, int, int]:
    return status.st_size, status.st_mtime_ns, status.st_ctime_ns


def _fsync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
