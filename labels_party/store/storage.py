"""Files under the data directory: label versions, the example registry, per-example budget vectors and
privatized labels. Every write goes to a temporary file that is fsynced and atomically renamed, and a file only
counts once a committed database row points at it — a crash leaves at worst an unreferenced file behind.
"""

from __future__ import annotations

import hashlib
import io
import mmap
import os
import stat
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from shared.errors import ErrorCode, LabelDPError
from shared.parts import parquet_parts

ROW_GROUP_CELLS = 1 << 21  # a written table's row groups: 1,048,576 rows of (example_id, label)


class OutsideDataDirectory(LabelDPError, OSError):
    """A stored name that is no file of the data directory (:meth:`DataStore.path`): a row edited outside the service
    (503 ``ledger_tampered`` where a request meets it; an ``OSError``, a missing file, to every reader of files)."""

    def __init__(self, message: str):
        super().__init__(f"{message}: the database was changed outside the service", code=ErrorCode.LEDGER_TAMPERED)


class DataStore:
    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        # digests already computed, by file and the stat of its parts: a file served again is not read again
        self._digests: dict[str, tuple[tuple, tuple[int, str]]] = {}
        self._digesting = threading.Lock()

    def path(self, relative: str) -> Path:
        """Where ``relative`` is under the data directory. Rows name files, and a database writer can edit rows: a
        name that is absolute or steps out (``..``), or a file there that is neither a regular file nor a
        directory (a link, a device, a FIFO: the thirty-seventh review's ``datasets/<id>/../../dev/zero`` kept a
        release request and verify-audit hashing forever), is :class:`OutsideDataDirectory` — an ``OSError``, which
        every reader treats as a missing file."""
        parts = Path(relative).parts
        if Path(relative).is_absolute() or ".." in parts:
            raise OutsideDataDirectory(f"{relative!r} is not a file of the data directory")
        target = self.root.joinpath(*parts)
        try:
            mode = os.lstat(target).st_mode
        except FileNotFoundError:
            return target  # (one about to be written)
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            raise OutsideDataDirectory(f"{relative!r} is not a regular file or directory of the data directory")
        return target

    def read_small(self, relative: str, limit: int) -> bytes:
        """A small file's bytes: a regular file of at most ``limit`` bytes, opened without following a link or
        waiting on a FIFO — a data-directory writer's pipe, device or huge sparse file in its place is refused
        (:class:`OutsideDataDirectory`), never read whole (the thirty-eighth review: an anchor or revocation of
        1.5 GiB took a request to 3.4 GB; a FIFO among the revocations hung every request)."""
        descriptor = os.open(self.path(relative), os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        try:
            found = os.fstat(descriptor)
            if not stat.S_ISREG(found.st_mode) or found.st_size > limit:
                raise OutsideDataDirectory(f"{relative!r} is not a regular file of at most {limit} bytes")
            pieces, size = [], 0
            while size <= limit and (piece := os.read(descriptor, limit + 1 - size)):
                pieces.append(piece)
                size += len(piece)
        finally:
            os.close(descriptor)
        if size > limit:  # (grown since its stat)
            raise OutsideDataDirectory(f"{relative!r} is not a regular file of at most {limit} bytes")
        return b"".join(pieces)

    def checked_array(self, relative: str, dtype, entries: int, sha256: str | None, *,
                      private: bool = False) -> MappedArray:
        """The 1-D ``.npy`` array a chain records by its entries' count and SHA-256 (a coverage set, an account's
        classes), mapped: a regular file, opened once without following a link or waiting on a FIFO, of exactly
        the header :func:`write_npy` writes and ``entries`` entries of ``dtype`` — anything else is refused unread
        — whose entries hash to ``sha256`` (:class:`OutsideDataDirectory` else; None: an array recorded before its
        hash was, which the caller checks otherwise). The thirty-ninth review narrowed a
        version's coverage file to one index and each charge of a release of the version's 2,000 labels charged one
        example; a sparse one of 2²⁸ entries took a charge to +4.1 GB.

        ``private``: what a charge reads — the entries copied, as they are hashed, into an unnamed file of this
        process that no writer of the data directory can reach, and mapped from it (the fortieth review wrote the
        file in place between its check and its read: three full releases on one allocation). Otherwise the file
        itself is mapped, and hashed again only when it changed (its size, inode, modification or status-change
        time, once they are older than :data:`SETTLED_SECONDS`: a rewrite within a coarse clock's tick keeps them)."""
        header, itemsize = npy_header(dtype, entries), np.dtype(dtype).itemsize
        descriptor = os.open(self.path(relative), os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        try:
            found = os.fstat(descriptor)
            length = entries * itemsize
            if not stat.S_ISREG(found.st_mode) or found.st_size != len(header) + length or \
                    os.pread(descriptor, len(header), 0) != header:
                raise OutsideDataDirectory(f"{relative!r} is not the array its chain records")
            if private:
                copy = self._scratch_file()
                with copy:
                    copied = _entries_sha256(descriptor, len(header), length, copy.fileno())
                    if sha256 is not None and copied != sha256:
                        raise OutsideDataDirectory(f"{relative!r} is not the array its chain records")
                    return MappedArray.of_descriptor(copy.fileno(), np.dtype(dtype), 0, entries)
            if sha256 is None:
                return MappedArray.of_descriptor(descriptor, np.dtype(dtype), len(header), entries)
            signature = (found.st_size, found.st_ino, found.st_mtime_ns, found.st_ctime_ns)
            with self._digesting:
                known = self._digests.get(f"array:{relative}")
            if known is None or known != (signature, (found.st_size, sha256)):
                if _entries_sha256(descriptor, len(header), length) != sha256:
                    raise OutsideDataDirectory(f"{relative!r} is not the array its chain records")
                if _settled(found):
                    with self._digesting:
                        self._digests[f"array:{relative}"] = (signature, (found.st_size, sha256))
            return MappedArray.of_descriptor(descriptor, np.dtype(dtype), len(header), entries)
        finally:
            os.close(descriptor)

    def _scratch_file(self):
        """An unnamed file under ``tmp/`` (O_TMPFILE: no name any writer can reach; gone once closed and
        unmapped); a ``tmp`` that is not a directory of the data directory is :class:`OutsideDataDirectory`."""
        try:
            self.path("tmp").mkdir(parents=True, exist_ok=True)
            return tempfile.TemporaryFile(dir=self.path("tmp"))
        except (FileExistsError, NotADirectoryError):
            raise OutsideDataDirectory("'tmp' is not a directory of the data directory") from None

    def npy_entries(self, relative: str, at_most: int) -> int:
        """The entries a 1-D ``.npy`` file's header announces (at most ``at_most``: :class:`OutsideDataDirectory`
        else), read from its first bytes only — the count of an array a chain recorded without it."""
        try:
            header = io.BytesIO(self.read_head(relative, 1 << 16))
            version = np.lib.format.read_magic(header)
            reader = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, _fortran, _dtype = reader(header)
        except ValueError:
            raise OutsideDataDirectory(f"{relative!r} is not an array") from None
        if len(shape) != 1 or shape[0] > at_most:
            raise OutsideDataDirectory(f"{relative!r} is not an array of at most {at_most} entries")
        return int(shape[0])

    def read_head(self, relative: str, limit: int) -> bytes:
        """A regular file's first ``limit`` bytes, opened without following a link or waiting on a FIFO."""
        descriptor = os.open(self.path(relative), os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        try:
            if not stat.S_ISREG(os.fstat(descriptor).st_mode):
                raise OutsideDataDirectory(f"{relative!r} is not a regular file")
            return os.pread(descriptor, limit, 0)
        finally:
            os.close(descriptor)

    def write_with(self, relative: str, write) -> str:
        """``write(path)`` fills a temporary file that then becomes ``relative`` atomically."""
        target = self.path(relative)
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
        try:
            write(temporary)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise
        return self.adopt(temporary, relative)

    def adopt(self, source: Path, relative: str) -> str:
        """Move a finished file (on the same file system, e.g. under ``tmp/``) to ``relative``, durably."""
        target = self.path(relative)
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(source, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(source, target)
        directory = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
        return relative

    def write_table(self, relative: str, table: pa.Table) -> str:
        """A Parquet file whose row groups hold at most ``ROW_GROUP_CELLS`` cells (a page reads whole groups)."""
        rows = max(1024, ROW_GROUP_CELLS // max(1, table.num_columns))
        return self.write_with(relative, lambda p: pq.write_table(table, p, compression="zstd", row_group_size=rows))

    def read_table(self, relative: str, columns: list[str] | None = None) -> pa.Table:
        return pq.read_table(self.path(relative), columns=columns)

    def write_array(self, relative: str, array: np.ndarray) -> str:
        def write(p):
            with open(p, "wb") as handle:
                np.save(handle, array)
        return self.write_with(relative, write)

    def read_array(self, relative: str, max_bytes: int | None = None) -> np.ndarray:
        """A stored array, read from one descriptor (:meth:`open_regular`); with ``max_bytes`` (the most any honest
        one can hold), a larger file is refused (``ValueError``) before it is read — a data-directory writer's
        large file is never loaded whole — and so is one whose header announces more than it holds (the
        forty-first review's 192-byte table of 2⁴⁰ rows)."""
        with self.open_regular(relative) as handle:
            size = os.fstat(handle.fileno()).st_size
            if max_bytes is not None and size > max_bytes:
                raise ValueError(f"{relative!r} is larger than any array it can be")
            version = np.lib.format.read_magic(handle)
            reader = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, _fortran, dtype = reader(handle)
            if dtype.hasobject or handle.tell() + int(np.prod(shape)) * dtype.itemsize != size:
                raise ValueError(f"{relative!r} is not the array its header announces")
            handle.seek(0)
            return np.load(handle, allow_pickle=False)

    def open_regular(self, relative: str) -> BinaryIO:
        """A regular file of the data directory, opened once without following a link or waiting on a FIFO
        (:class:`OutsideDataDirectory` else): what is read is what was checked — the forty-first review renamed a
        FIFO over a spent table between its check and ``np.load``'s open, and the charge, holding the database's
        lock, hung the service."""
        descriptor = os.open(self.path(relative), os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            os.close(descriptor)
            raise OutsideDataDirectory(f"{relative!r} is not a regular file")
        return os.fdopen(descriptor, "rb")

    def digest(self, relative: str) -> tuple[int, str]:
        """(bytes, SHA-256) of a file, or of a directory's Parquet part files in order (a Spark job's output) —
        what a download serves. Raises OSError if it is missing."""
        return file_digest(self.path(relative))

    def checked_digest(self, relative: str, expected_bytes: int | None = None) -> tuple[int, str]:
        """:meth:`digest`, computed again only when a part of the file changed since: its size, inode, modification
        or status-change time (the last changes on every write and cannot be set back). Raises OSError if it is
        missing, or a part is not a regular file. With ``expected_bytes`` (what the chain recorded), a file of
        another size is not read: (its size, "") — the thirty-eighth review's 15 TiB sparse label file took a
        release request hours of hashing."""
        stats = [(p, os.lstat(p)) for p in parquet_parts(self.path(relative))]
        if not all(stat.S_ISREG(st.st_mode) for _p, st in stats):
            raise OutsideDataDirectory(f"{relative!r} has a part that is not a regular file")
        signature = tuple((str(p), st.st_size, st.st_ino, st.st_mtime_ns, st.st_ctime_ns) for p, st in stats)
        size = sum(st.st_size for _p, st in stats)
        if expected_bytes is not None and size != expected_bytes:
            return size, ""
        with self._digesting:
            known = self._digests.get(relative)
        if known is not None and known[0] == signature:
            return known[1]
        found = file_digest(self.path(relative), size)
        if all(_settled(st) for _p, st in stats):
            with self._digesting:
                self._digests[relative] = (signature, found)
        return found

    def open_checked(self, relative: str, size: int, sha256: str) -> OpenedFile:
        """A file — or a directory's part files (a Spark job's output), in order — opened once, each without
        following a link or waiting on a FIFO, whose bytes are ``size`` and ``sha256`` (:class:`OutsideDataDirectory`
        else), hashed from those very descriptors — again only when their status changed — so that what is then
        read from them is what was checked: the forty-second review renamed the label version's file over a
        release's between its check and the download's open, and 139 of 1,726 downloads served the true labels.
        :meth:`OpenedFile.unchanged` tells a reader that goes on reading whether a part was written since."""
        parts = [self.open_regular(str(p.relative_to(self.root))) for p in parquet_parts(self.path(relative))]
        opened = OpenedFile(parts, [_status(part) for part in parts])
        try:
            if sum(stamp[0] for stamp in opened.stamps) != size:
                raise OutsideDataDirectory(f"{relative!r} is not the file its chain records")
            with self._digesting:
                known = self._digests.get(f"opened:{relative}")
            if known != (tuple(opened.stamps), (size, sha256)):
                digest = hashlib.sha256()
                for part, stamp in zip(parts, opened.stamps, strict=True):
                    _entries_sha256(part.fileno(), 0, stamp[0], into=digest)
                if digest.hexdigest() != sha256:
                    raise OutsideDataDirectory(f"{relative!r} is not the file its chain records")
                if all(_settled(os.fstat(part.fileno())) for part in parts):
                    with self._digesting:
                        self._digests[f"opened:{relative}"] = (tuple(opened.stamps), (size, sha256))
            opened.unchanged()
        except BaseException:
            opened.close()
            raise
        return opened

    def stamp(self, relative: str) -> tuple:
        """A file's status (of each part: size, inode, modification and status-change time): a file renamed in
        and back, or written in place, has another."""
        return tuple((st.st_size, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
                     for st in (os.lstat(p) for p in parquet_parts(self.path(relative))))

    def size(self, relative: str) -> int:
        """Bytes of a file, or of a directory's Parquet part files — what :meth:`digest` reads, without reading it."""
        return sum(part.stat().st_size for part in parquet_parts(self.path(relative)))

    def remove(self, relative: str) -> None:
        try:
            self.path(relative).unlink()
        except FileNotFoundError:
            pass


def file_digest(path: Path, at_most: int | None = None) -> tuple[int, str]:
    """(bytes, SHA-256) of ``path`` — a directory: of its ``part-*.parquet`` files in name order — read in blocks,
    each part opened without following a link or waiting on a FIFO; with ``at_most``, reading stops one byte past
    it (a file that grew since its size was checked is not read to its end: its size then differs)."""
    digest, size, limit = hashlib.sha256(), 0, None if at_most is None else at_most + 1
    for file in parquet_parts(path):
        descriptor = os.open(file, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        with os.fdopen(descriptor, "rb") as handle:
            if not stat.S_ISREG(os.fstat(descriptor).st_mode):
                raise OutsideDataDirectory(f"{file.name!r} is not a regular file")
            while (limit is None or size < limit) and \
                    (block := handle.read(1 << 20 if limit is None else min(1 << 20, limit - size))):
                digest.update(block)
                size += len(block)
    return size, digest.hexdigest()


def npy_header(dtype, entries: int) -> bytes:
    """The header :func:`write_npy` (and ``np.save``) writes before ``entries`` entries of ``dtype``."""
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
                                                  "fortran_order": False, "shape": (int(entries),)})
    return buffer.getvalue()


def _entries_sha256(descriptor: int, offset: int, length: int, copy: int | None = None, into=None) -> str:
    """SHA-256 of ``length`` bytes of a file from ``offset`` — no more, however the file grows meanwhile (the
    forty-first review extended one by 1 GiB between its size check and its copy) — read in blocks (nothing of it
    stays resident); each block also written to ``copy`` (a descriptor), if given; ``into``: a digest to go on."""
    digest, end = into if into is not None else hashlib.sha256(), offset + length
    while offset < end and (block := os.pread(descriptor, min(1 << 20, end - offset), offset)):
        digest.update(block)
        offset += len(block)
        if copy is not None:
            view = memoryview(block)
            while view:
                view = view[os.write(copy, view):]
    return digest.hexdigest()


class OpenedFile:
    """Part files opened once and checked (:meth:`DataStore.open_checked`), with their status then."""

    def __init__(self, parts: list[BinaryIO], stamps: list[tuple]):
        self.parts, self.stamps = parts, stamps

    def unchanged(self) -> None:
        """Raise :class:`OutsideDataDirectory` if a part was written since it was checked (its size or
        modification or status-change time moved: a reader calls this after each read, before it hands on what it
        read)."""
        if [_status(part) for part in self.parts] != self.stamps:
            raise OutsideDataDirectory("a file changed while it was read")

    def close(self) -> None:
        for part in self.parts:
            part.close()


def _status(handle: BinaryIO) -> tuple:
    found = os.fstat(handle.fileno())
    return found.st_size, found.st_ino, found.st_mtime_ns, found.st_ctime_ns


SETTLED_SECONDS = 2.0  # a file's status is trusted to show a change only once it is older than a clock's tick


def _settled(found: os.stat_result) -> bool:
    return time.time() - max(found.st_mtime, found.st_ctime) > SETTLED_SECONDS


def write_npy(path: Path, dtype, total: int, chunks: Iterable[np.ndarray]) -> None:
    """An ``.npy`` file of ``total`` entries written chunk by chunk (no array of the whole file in memory)."""
    dtype = np.dtype(dtype)
    written = 0
    with open(path, "wb") as handle:
        handle.write(npy_header(dtype, total))
        for chunk in chunks:
            chunk = np.ascontiguousarray(chunk, dtype=dtype)
            handle.write(chunk.tobytes())
            written += chunk.size
    if written != total:
        raise ValueError(f"wrote {written} entries, announced {total}")


class MappedArray:
    """A read-only 1-D ``.npy`` file mapped into memory. ``forget()`` drops the pages read so far from this
    process's resident set (they stay in the page cache): a pass over 10⁸ entries keeps memory bounded."""

    def __init__(self, path: Path):
        with open(path, "rb") as handle:
            version = np.lib.format.read_magic(handle)
            reader = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, _fortran, dtype = reader(handle)
            self._map_entries(handle.fileno(), dtype, handle.tell(), int(np.prod(shape)))

    @classmethod
    def of_descriptor(cls, descriptor: int, dtype: np.dtype, offset: int, entries: int) -> MappedArray:
        """``entries`` of ``dtype`` from ``offset`` of an open file (checked by the caller)."""
        mapped = cls.__new__(cls)
        mapped._map_entries(descriptor, dtype, offset, entries)
        return mapped

    def _map_entries(self, descriptor: int, dtype: np.dtype, offset: int, entries: int) -> None:
        self._map = mmap.mmap(descriptor, 0, access=mmap.ACCESS_READ) if entries else None
        self.array = (np.frombuffer(self._map, dtype=dtype, count=entries, offset=offset) if self._map is not None
                      else np.zeros(0, dtype=dtype))

    @property
    def size(self) -> int:
        return self.array.size

    def slice(self, start: int, stop: int) -> np.ndarray:
        return np.array(self.array[start:stop])

    def position(self, values) -> np.ndarray:
        """Where ``values`` would go in the (sorted) array."""
        return np.searchsorted(self.array, values)

    def forget(self) -> None:
        if self._map is not None:
            self._map.madvise(mmap.MADV_DONTNEED)
