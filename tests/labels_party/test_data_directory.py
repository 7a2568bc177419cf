"""Files a data-directory writer can replace (issue 40's thirty-eighth review): an anchor or a revocation of
1.5 GiB took a request to 3.4 GB, a FIFO among the revocations hung every request, the heads log as a FIFO held a
charge until a reader came, and a 15 TiB sparse label file kept a release hashing for hours. Small files are read
only as small regular files, the heads log only as a regular file, and a file of another size than the chain
recorded is not hashed. ~1 s."""

from __future__ import annotations

import os
import signal

import pytest

from labels_party.ledger import signing
from labels_party.ledger.books import Ledger
from labels_party.store.storage import DataStore, OutsideDataDirectory


@pytest.fixture
def store(tmp_path):
    return DataStore(tmp_path / "data")


def _sparse(path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as handle:
        handle.truncate(size)


def test_an_anchor_or_revocation_that_is_huge_or_a_fifo_is_refused_unread(store):
    _sparse(store.path("anchors/d.json"), 3 << 29)
    with pytest.raises(OutsideDataDirectory):
        Ledger(store).read_anchor("d")
    os.makedirs(store.path("keys/revoked"))
    os.mkfifo(store.path("keys/revoked/a.json"))
    signal.alarm(10)  # (waiting on the pipe is the failure)
    try:
        with pytest.raises(OutsideDataDirectory):
            Ledger(store).revocations.refuses(1, "p", "s", None)
    finally:
        signal.alarm(0)
    (store.path("anchors/e.json")).write_text('{"seq": 1, "head": "h", "previous_seq": 0, "previous_head": "g"}')
    assert Ledger(store).read_anchor("e").seq == 1  # an honest one is read


def test_a_heads_log_that_is_a_fifo_is_refused_at_once(tmp_path):
    key = tmp_path / "audit.pem"
    signing.create_key_file(key)
    (tmp_path / "audit").mkdir()
    os.mkfifo(tmp_path / "audit" / signing.LOG_NAME)
    signer = signing.HeadSigner(signing.load_key_file(key), tmp_path / "audit")
    signal.alarm(10)
    try:
        with pytest.raises(OSError):
            signer.export(signer.sign("d", 1, "0" * 64))
    finally:
        signal.alarm(0)


def test_a_file_of_another_size_than_chained_is_not_hashed(store):
    _sparse(store.path("datasets/d/labels.parquet"), 15 << 40)  # 15 TiB, a few blocks on disk
    assert store.checked_digest("datasets/d/labels.parquet", 1000) == (15 << 40, "")
    store.path("datasets/d/small.parquet").write_bytes(b"x" * 1000)
    assert store.checked_digest("datasets/d/small.parquet", 1000)[1] != ""


def test_a_release_owns_only_its_own_file():
    """The thirty-eighth review inserted a release of id "." naming "releases/.": its exhausted job removed every
    release's labels."""
    from labels_party.store import db
    assert db.Release(id="ab12", file="releases/ab12").own_file() == "releases/ab12"
    assert db.Release(id="ab12", file="releases/ab12.parquet").own_file() == "releases/ab12.parquet"
    assert db.Release(id=".", file="releases/.").own_file() is None
    assert db.Release(id="ab12", file="releases/ab12/../x").own_file() is None
