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

Each check lists the directory (a revocation by another process or replica adds a file) and reads only files it has
not read before.
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from labels_party.store.storage import DataStore

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
        return cls(frozenset(int(i) for i in document["key_ids"]), frozenset(map(str, document["prefixes"])),
                   frozenset(map(str, document["secret_digests"])),
                   datetime.fromisoformat(document["effective_at"]), str(document["revoked_by"]))


REVOCATION_BYTES = 1 << 16  # a revocation file is under a kilobyte of JSON: anything far larger is not one


@dataclass
class RevocationList:
    """The data directory's revocations, as this process last read them."""

    store: DataStore
    _read: dict[str, Revocation] = field(default_factory=dict, repr=False)  # by file name: files are never removed
    _reading: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, revocation: Revocation) -> None:
        """Record ``revocation`` durably (a file of its own: replicas never write the same one)."""
        self.store.write_with(f"{DIRECTORY}/{uuid.uuid4().hex}.json",
                              lambda path: path.write_text(json.dumps(revocation.document())))

    def refuses(self, key_id: int, prefix: str, secret_digest: str, now: datetime) -> Revocation | None:
        """The revocation in force at ``now`` that names the key by any of its identities (None: none does)."""
        for revocation in self._revocations():
            if revocation.effective_at <= now and revocation.names(key_id, prefix, secret_digest):
                return revocation
        return None

    def _revocations(self) -> list[Revocation]:
        directory = self.store.path(DIRECTORY)
        try:
            names = [n for n in os.listdir(directory) if n.endswith(".json")]
        except FileNotFoundError:
            return []
        with self._reading:
            new = [n for n in names if n not in self._read]
        # an unreadable or malformed file is the data directory's damage: raised, never skipped (skipping it
        # would honour the key it revokes)
        parsed = {n: Revocation.parse(json.loads(self.store.read_small(f"{DIRECTORY}/{n}", REVOCATION_BYTES)))
                  for n in new}
        with self._reading:
            self._read.update(parsed)
            return list(self._read.values())
