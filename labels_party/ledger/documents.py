"""Mechanism documents: a release's full public description, stored once, compactly, and addressed by content.

A document is ``{"description": <the mechanism's describe()>, "noisy_prior": <the prior's describe() or null>}``
— everything the features party may need to use the privatized labels (output values, exact probabilities as
integers over 2**53 or in closed form, noisy counts, model parameters, the certified ε; the release's ``dp_event``
is its ledger record's). Its address is the SHA-256 of its canonical JSON, so a consumer recomputes it from what it
fetched, and identical documents (two Laplace releases at the same ε on the same domain) are stored once. A release
row and response keep only a :func:`summary` (the document without its arrays), so they stay small whatever |Y| is.

Stored and served in one binary columnar form (:func:`pack`, media type :data:`BINARY_MEDIA_TYPE`): an ``.npz``
archive (zip-deflated) whose ``document.json`` is the document with every numeric list — a vector, or a
rectangular matrix of all-integer or all-float entries — replaced by ``{"$array": i}``, and whose arrays ``a{i}``
hold them as int64 or float64, each distinct array once (the same output grid in 1000 groups is one array).
``GET /v1/mechanisms/{hash}`` answers those stored bytes as they are, or :func:`unpack`'s JSON. A group release's
description is itself columnar (:meth:`labels_party.core.pipeline.GroupPrivatization.describe`): the size of a document
is predicted from public inputs before a release is charged (:mod:`labels_party.releases.kinds`).
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from typing import Any

import numpy as np
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from labels_party.ledger import canonical
from labels_party.runtime.settings import LabelsSettings
from labels_party.store import db

BINARY_MEDIA_TYPE = "application/vnd.labeldp.mechanism+npz"
SKELETON = "document.json"
INT64 = (-(1 << 63), (1 << 63) - 1)
# The bytes that open or separate JSON values ({ [ , :) outside strings: an honest skeleton (the document without its
# numeric lists) holds a few thousand; 32 MiB of "{}," deflates to 32 KB and parses to 1.5 GB (issue 40's seventh
# review). Separators inside strings (a group's name may hold any) are not values.
_SEPARATORS = np.frombuffer(b"{[,:", dtype=np.uint8)
_QUOTE, _BACKSLASH = ord('"'), ord("\\")
MAX_STRING_BYTES = 1 << 20  # a string of a skeleton (names, notes) is far shorter
DEFAULT_MAX_BYTES: int = LabelsSettings.model_fields["max_document_bytes"].default  # the service passes its own


def summary(value: Any) -> Any:
    """The document without lists (recursively): what a release row and its response keep."""
    if isinstance(value, dict):
        return {k: summary(v) for k, v in value.items() if not isinstance(v, list)}
    return value


def shown(document: dict) -> tuple[str, str | None]:
    """What a release's row shows of its mechanism document — the summaries of its description and noisy prior — as
    the document reads once stored (canonical JSON: tuples are lists, so dropped), so that verify-audit finds the
    row's summary in the document it stores."""
    plain = json.loads(canonical(document))
    prior = plain.get("noisy_prior")
    return json.dumps(summary(plain["description"])), json.dumps(summary(prior)) if prior else None


def address(document: dict) -> str:
    return hashlib.sha256(canonical(document).encode()).hexdigest()


def store(session: Session, document: dict) -> str:
    """Insert the document unless it is already there (concurrent identical inserts are fine); its address."""
    digest = address(document)
    dialect = session.get_bind().dialect.name
    insert = (postgresql.insert if dialect == "postgresql" else sqlite.insert)(db.MechanismDocument)
    session.execute(insert.values(hash=digest, body=pack(document), created_at=db.utcnow())
                    .on_conflict_do_nothing(index_elements=["hash"]))
    return digest


def stored(session: Session, digest: str) -> bytes:
    """The packed document at ``digest`` (it exists: a release references it)."""
    document = session.get(db.MechanismDocument, digest)
    assert document is not None  # the foreign key of the release that named it
    return document.body


def pack(document: dict) -> bytes:
    """The binary form: numeric lists become arrays (each distinct one once), the rest stays JSON."""
    arrays: list[np.ndarray] = []
    seen: dict[tuple, int] = {}

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items()}
        if isinstance(value, list):
            array = _numeric_array(value)
            if array is None:
                return [strip(v) for v in value]
            key = (array.dtype.str, array.shape, array.tobytes())
            if key not in seen:
                seen[key] = len(arrays)
                arrays.append(array)
            return {"$array": seen[key]}
        return value

    skeleton = canonical(strip(document)).encode()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(SKELETON, skeleton)
        for i, array in enumerate(arrays):
            with archive.open(f"a{i}.npy", "w") as member:
                np.lib.format.write_array(member, array, allow_pickle=False)
    return buffer.getvalue()


class Unreadable(ValueError):
    """A stored document that is not one :func:`pack` wrote, or that would expand beyond what any release may
    publish: the database was changed outside the service (its callers answer ``ledger_tampered``)."""


def unpack(data: bytes, max_bytes: int = DEFAULT_MAX_BYTES) -> dict:
    """The document :func:`pack` stored in ``data``. ``max_bytes``: the service's ``max_document_bytes``, which
    bounds every document a release may create at 8 bytes per published number — so no honest document expands to
    more than ``max_bytes // 8`` numbers, however many places name one array, and its skeleton is at most
    ``max_bytes`` holding at most ``max_bytes // 64`` JSON values. Anything else is refused before it is expanded
    (issue 40's sixth review: an 8 KB row naming one 10⁶-number array 100 times took a consumer's request to 2 GB;
    the seventh's: a 32 KB skeleton of "{}," parsed to 1.5 GB), as :class:`Unreadable`."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            sizes = {info.filename: info.file_size for info in archive.infolist()}
            if sizes.get(SKELETON, max_bytes + 1) > max_bytes:
                raise Unreadable("its skeleton is missing or larger than any document")
            _count_values(archive, max_bytes // 64)  # before it is parsed: each makes a Python object (~100 B)
            # read no further than the listed size (zipfile); decoded as ASCII first, as it was counted: given bytes,
            # json.loads guesses UTF-16 or -32 from NULs, and in UTF-16 a counted quote is half of another character;
            # and one character outside the BMP would make the whole text four bytes a character (the tenth review's
            # 32 KB row parsed to 249 MB)
            skeleton = json.loads(archive.read(SKELETON).decode("ascii"))
            named = _references(skeleton)
            arrays: dict[int, np.ndarray] = {}  # each stored array read once, however many places name it
            for index in sorted(set(named)):
                arrays[index] = _read_array(archive, f"a{index}.npy", sizes,
                                            max_bytes - 8 * sum(a.size for a in arrays.values()))
            if sum(arrays[index].size for index in named) > max_bytes // 8:  # before anything is expanded
                raise Unreadable("it expands beyond what any document may publish")

            def fill(value: Any) -> Any:
                if isinstance(value, dict):
                    if set(value) == {"$array"}:
                        return arrays[value["$array"]].tolist()  # a list of its own: callers may change theirs
                    return {k: fill(v) for k, v in value.items()}
                if isinstance(value, list):
                    return [fill(v) for v in value]
                return value

            return fill(skeleton)
    except Unreadable:
        raise
    except (zipfile.BadZipFile, KeyError, ValueError, EOFError, OSError, RecursionError) as error:
        raise Unreadable(f"it cannot be read ({type(error).__name__})") from None


def _count_values(archive: zipfile.ZipFile, limit: int, piece_bytes: int = 1 << 20) -> int:
    """Refuse a skeleton of more than ``limit`` JSON values (counted by the bytes that open or separate them outside
    strings), or with a string longer than :data:`MAX_STRING_BYTES`, read in pieces: a bomb is refused after its
    first few hundred kilobytes. Vectorized, in memory linear in a piece (a regular expression's backtracking kept
    a record per character of a long string: the ninth review's 8 KB row took 352 MB). Returns the count."""
    scan = _Scan()
    with archive.open(SKELETON) as member:
        while piece := member.read(piece_bytes):
            codes = np.frombuffer(piece, dtype=np.uint8)
            if codes.max() > 0x7F:  # pack writes ASCII (canonical escapes the rest): one byte a character
                raise Unreadable("its skeleton is not ASCII")
            scan.add(codes)
            if scan.values > limit:
                raise Unreadable("its skeleton holds more JSON values than any document")
            if scan.longest > MAX_STRING_BYTES:
                raise Unreadable("its skeleton holds a string longer than any document's")
    return scan.values


class _Scan:
    """The state of a JSON text read piece by piece: inside a string or not, the backslashes that end the text read
    so far, the open string's length; the values and the longest string seen. A quote ends or opens a string unless
    an odd run of backslashes precedes it (outside strings a backslash is not JSON: the parser refuses it there)."""

    def __init__(self) -> None:
        self.inside, self.backslashes, self.open_length, self.values, self.longest = False, 0, 0, 0, 0

    def add(self, piece: np.ndarray) -> None:
        n = len(piece)
        position = np.arange(n, dtype=np.int64)
        # the last byte at or before each position that is not a backslash (-1: backslashes since the piece began)
        plain = np.maximum.accumulate(np.where(piece != _BACKSLASH, position, -1))
        quotes = np.flatnonzero(piece == _QUOTE)
        before = np.where(quotes > 0, plain[np.maximum(quotes - 1, 0)], -1)
        run = quotes - 1 - before + np.where(before < 0, self.backslashes, 0)
        real = quotes[run % 2 == 0]  # the quotes that open or close a string
        separators = np.flatnonzero(np.isin(piece, _SEPARATORS))
        outside = (np.searchsorted(real, separators) + int(self.inside)) % 2 == 0
        self.values += int(np.count_nonzero(outside))
        # string lengths: from each opening quote to its closing one (the first closes a string begun earlier)
        edges = np.concatenate(([-self.open_length - 1] if self.inside else [], real)).astype(np.int64)
        closed = len(edges) // 2
        if closed:
            self.longest = max(self.longest, int((edges[1:2 * closed:2] - edges[0:2 * closed:2]).max()) - 1)
        self.inside = len(edges) % 2 == 1
        self.open_length = int(n - 1 - edges[-1]) if self.inside else 0
        self.longest = max(self.longest, self.open_length)
        self.backslashes = int(n - 1 - plain[-1]) + (self.backslashes if plain[-1] < 0 else 0) if n else 0


def _references(skeleton: Any) -> list[int]:
    """The array indices the skeleton names, once per place (iteratively: a deep skeleton is no recursion)."""
    named, pending = [], [skeleton]
    while pending:
        value = pending.pop()
        if isinstance(value, dict):
            if set(value) == {"$array"}:
                index = value["$array"]
                if not isinstance(index, int) or isinstance(index, bool):
                    raise Unreadable("an array reference is not an index")
                named.append(index)
            else:
                pending.extend(value.values())
        elif isinstance(value, list):
            pending.extend(value)
    return named


def _read_array(archive: zipfile.ZipFile, name: str, sizes: dict[str, int], max_bytes: int) -> np.ndarray:
    """One stored array, its header checked against the archive's listing before its data is read: int64 or
    float64, of at most ``max_bytes // 8`` numbers (what the arrays read before it left), exactly as long as the
    listing says."""
    if name not in sizes:
        raise Unreadable(f"it names an array it does not hold ({name})")
    with archive.open(name) as member:
        version = np.lib.format.read_magic(member)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
            np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read_header(member)  # a header of at most 10,000 bytes (numpy's own bound)
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if dtype not in (np.dtype("<i8"), np.dtype("<f8")) or not 0 <= count <= max_bytes // 8 or \
                sizes[name] != member.tell() + 8 * count:
            raise Unreadable(f"its array {name} is not one a document holds")
        data = np.frombuffer(member.read(8 * count), dtype=dtype)
        if data.size != count:
            raise Unreadable(f"its array {name} is cut short")
        return data.reshape(shape, order="F" if fortran else "C")


def _numeric_array(value: list) -> np.ndarray | None:
    """The list as an int64 array when every (possibly nested, rectangular) entry is an int, as a float64 one when
    every entry is a float; None otherwise — so that :func:`unpack` gives back exactly the same JSON (an int stays
    an int, a float a float) and the document keeps its address."""
    kinds = {_kind(v) for v in _leaves(value)}
    if len(kinds) != 1 or None in kinds:
        return None
    try:
        array = np.array(value, dtype=np.int64 if kinds == {int} else np.float64)
    except (ValueError, OverflowError):  # ragged, or an integer beyond int64
        return None
    return array if array.size else None


def _kind(value) -> type | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return int if INT64[0] <= value <= INT64[1] else None
    return float if isinstance(value, float) else None


def _leaves(value: list):
    for v in value:
        if isinstance(v, list):
            yield from _leaves(v)
        else:
            yield v
