"""Files a data-directory writer can replace (issue 40's thirty-eighth review): an anchor or a revocation of
1.5 GiB took a request to 3.4 GB, a FIFO among the revocations hung every request, the heads log as a FIFO held a
charge until a reader came, and a 15 TiB sparse label file kept a release hashing for hours. Small files are read
only as small regular files, the heads log only as a regular file, and a file of another size than the chain
recorded is not hashed. ~1 s."""

from __future__ import annotations

import hashlib
import os
import signal

import numpy as np
import pytest

from labels_party.ledger import signing
from labels_party.ledger.books import Ledger
from labels_party.store.storage import DataStore, OutsideDataDirectory, _entries_sha256, file_digest, write_npy


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


def test_what_is_read_is_the_descriptor_that_was_checked(store, monkeypatch):
    """The forty-first review: a FIFO renamed over a spent table between its check and ``np.load``'s open hung a
    charge (holding the database's lock) and every request behind it; a 192-byte table whose header announced 2⁴⁰
    rows reached ``np.load``. A file is opened once, without following a link or waiting on a FIFO, and an array's
    header must announce what the file holds."""
    os.makedirs(store.path("budget"))
    os.mkfifo(store.path("budget/spent.npy"))
    monkeypatch.setattr(DataStore, "path", lambda self, relative: self.root / relative)  # (the race: no lstat)
    signal.alarm(10)
    try:
        with pytest.raises(OutsideDataDirectory):
            store.read_array("budget/spent.npy")
    finally:
        signal.alarm(0)
    with open(store.path("budget/lie.npy"), "wb") as handle:
        np.lib.format.write_array_header_1_0(handle, {"descr": "<i8", "fortran_order": False, "shape": (1 << 40, 3)})
    with pytest.raises(ValueError, match="not the array its header announces"):
        store.read_array("budget/lie.npy")
    store.write_array("budget/honest.npy", np.arange(6).reshape(2, 3))
    assert store.read_array("budget/honest.npy").tolist() == [[0, 1, 2], [3, 4, 5]]


def test_a_file_that_grows_after_its_size_was_checked_is_read_no_further(store):
    """The forty-first review extended a coverage file by 1 GiB between its size check and its private copy: the
    copy read to the end (1 GiB of disk, 4.6 s). Hashes and copies read exactly what was checked."""
    path = store.path("grown.bin")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"h" * 10 + b"e" * 16)
    with open(path, "r+b") as handle:
        handle.truncate(26 + (1 << 30))  # grown by a sparse GiB
    descriptor = os.open(path, os.O_RDONLY)
    try:
        assert _entries_sha256(descriptor, 10, 16) == hashlib.sha256(b"e" * 16).hexdigest()
    finally:
        os.close(descriptor)
    assert file_digest(path, 26)[0] == 27  # one byte past what was checked: its size differs, nothing more read


def test_a_scratch_directory_that_is_a_file_is_503_not_500(store):
    """The forty-first review's M1: ``tmp`` replaced by a file made every charge a 500."""
    write_npy(store.path("coverage.npy"), np.int64, 3, [np.arange(3)])
    sha = hashlib.sha256(np.arange(3, dtype=np.int64).tobytes()).hexdigest()
    assert store.checked_array("coverage.npy", np.int64, 3, sha, private=True).slice(0, 3).tolist() == [0, 1, 2]
    os.rmdir(store.path("tmp"))
    store.path("tmp").write_text("")
    with pytest.raises(OutsideDataDirectory, match="'tmp' is not a directory"):
        store.checked_array("coverage.npy", np.int64, 3, sha, private=True)
