"""Key revocations kept outside the database: the data directory's ``keys/revoked/``, one file per revocation.

A revocation recorded only in the database can be undone by whoever writes it: put back the key's row and the
certificate copied before the revocation (:mod:`.key_certificates` signs rows, not their history), or make the
revocation reach no chain by pointing the row at a look-alike organization first (issue 40's fifth review: a revoked
consumer key charged again, a revoked owner's admin key granted). Every revocation therefore also writes, durably
and before its transaction commits, a file naming the key by every identity it had then — the row's id, prefix and
secret digest, and those its certificate states if the audit key signed it — and from when it is refused. A key any
of whose identities is on the list is refused from that time on, whatever its row and certificate say; a database
writer cannot remove a file of the data directory. A revocation whose transaction then fails still stands: the
operator asked for it.

Each check lists the directory again only if it changed (a revocation by another process or replica adds a file),
reads only files it has not read before, and finds a key's revocations by its identities.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from labels_party.store.storage import DataStore, OutsideDataDirectory

DIRECTORY = "keys/revoked"


@dataclass(frozen=True)
class Revocation:
    """One key's revocation: its identities (ids, prefixes, secret digests) and from when it is refused."""

    key_ids: frozenset[int]
    prefixes: frozenset[str]
    secret_digests: frozenset[str]
    effective_at: datetime  # aware, UTC
    revoked_by: str

    def names(self, key_id: int, prefix: str, secret_digest: str) -> bool:
        return key_id in self.key_ids or prefix in self.prefixes or secret_digest in self.secret_digests

    def document(self) -> dict[str, Any]:
        return {"key_ids": sorted(self.key_ids), "prefixes": sorted(self.prefixes),
                "secret_digests": sorted(self.secret_digests), "effective_at": self.effective_at.isoformat(),
                "revoked_by": self.revoked_by}

    @classmethod
    def parse(cls, document: dict[str, Any]) -> Revocation:
        if datetime.fromisoformat(document["effective_at"]).tzinfo is None:
            raise ValueError("a revocation's time is aware")
        return cls(frozenset(int(i) for i in document["key_ids"]), frozenset(map(str, document["prefixes"])),
                   frozenset(map(str, document["secret_digests"])),
                   datetime.fromisoformat(document["effective_at"]), str(document["revoked_by"]))


REVOCATION_BYTES = 1 << 16  # a revocation file is under a kilobyte of JSON: anything far larger is not one
# A deployment revokes a key at a time: more files than this is a data-directory writer's (the thirty-ninth
# review's 50,000 copies made every request scan them all; 10⁶ would have held 1.3 GB)
MAX_REVOCATIONS = 100_000
SETTLED_SECONDS = 2.0  # a listing is reused only once the directory has not changed for this long (coarse clocks)


@dataclass
class RevocationList:
    """The data directory's revocations, as this process last read them, indexed by the identities they name."""

    store: DataStore
    _read: dict[str, Revocation] = field(default_factory=dict, repr=False)  # by file name: files are never removed
    _naming: dict[tuple[str, object], list[Revocation]] = field(default_factory=dict, repr=False)
    _listed: tuple | None = field(default=None, repr=False)  # the directory's status when last listed
    _reading: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, revocation: Revocation) -> None:
        """Record ``revocation`` durably (a file of its own: replicas never write the same one)."""
        self.store.write_with(f"{DIRECTORY}/{uuid.uuid4().hex}.json",
                              lambda path: path.write_text(json.dumps(revocation.document())))

    def refuses(self, key_id: int, prefix: str, secret_digest: str, now: datetime) -> Revocation | None:
        """The revocation in force at ``now`` that names the key by any of its identities (None: none does)."""
        naming = self._index()
        for identity in (("id", key_id), ("prefix", prefix), ("secret", secret_digest)):
            for revocation in naming.get(identity, ()):
                if revocation.effective_at <= now:
                    return revocation
        return None

    def _index(self) -> dict[tuple[str, object], list[Revocation]]:
        """The revocations by identity, the directory listed again only when it changed (a revocation by another
        process or replica adds a file): a request costs a ``stat``, not a pass over every revocation."""
        directory = self.store.path(DIRECTORY)
        try:
            found = os.stat(directory)
        except FileNotFoundError:
            return {}
        listed = (found.st_ino, found.st_mtime_ns, found.st_ctime_ns)
        with self._reading:
            if listed == self._listed:
                return self._naming
        names = [n for n in os.listdir(directory) if n.endswith(".json")]
        if len(names) > MAX_REVOCATIONS:
            raise OutsideDataDirectory(f"{DIRECTORY!r} holds more than {MAX_REVOCATIONS:,} revocations")
        with self._reading:
            new = [n for n in names if n not in self._read]
        parsed = {n: self._parse(n) for n in new}
        with self._reading:
            for name, revocation in parsed.items():
                if name in self._read:
                    continue
                self._read[name] = revocation
                for identity in [*(("id", i) for i in revocation.key_ids),
                                 *(("prefix", p) for p in revocation.prefixes),
                                 *(("secret", d) for d in revocation.secret_digests)]:
                    self._naming.setdefault(identity, []).append(revocation)
            if time.time() - found.st_mtime > SETTLED_SECONDS:  # (a file added within the clock's tick is seen)
                self._listed = listed
            return self._naming

    def _parse(self, name: str) -> Revocation:
        """One revocation file. An unreadable or malformed one is the data directory's damage: refused
        (:class:`OutsideDataDirectory`: 503 ``ledger_tampered``), never skipped — skipping it would honour the key
        it revokes."""
        try:
            return Revocation.parse(json.loads(self.store.read_small(f"{DIRECTORY}/{name}", REVOCATION_BYTES)))
        except (ValueError, KeyError, TypeError, AttributeError):
            raise OutsideDataDirectory(f"{DIRECTORY}/{name} is not a revocation") from None
