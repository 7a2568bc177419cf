"""A source's snapshot (labels_party.spark.snapshot) on real files: what Spark would read is copied byte for byte;
a symbolic link anywhere on the way or under the source, a FIFO, and a file swapped or written while it is copied
are refused, and a refusal leaves nothing under the data directory."""

from __future__ import annotations

import hashlib
import os
import stat
import time

import pytest

from labels_party.spark import snapshot
from shared.errors import LabelDPError


@pytest.fixture()
def tree(tmp_path):
    """Two organizations' prefixes (``a/`` and ``b/``) and a data directory."""
    a, b = tmp_path / "a", tmp_path / "b"
    (a / "weeks" / "year=2020").mkdir(parents=True)
    (a / "weeks" / "part-00.parquet").write_bytes(b"A" * 1000)
    (a / "weeks" / "year=2020" / "part-01.parquet").write_bytes(b"a" * 10)
    (a / "weeks" / "_SUCCESS").write_bytes(b"")
    (a / "weeks" / ".part-00.parquet.crc").write_bytes(b"crc")
    (a / "weeks" / "_spark_metadata").mkdir()
    (b / "secret").mkdir(parents=True)
    (b / "secret" / "part-00.parquet").write_bytes(b"B" * 1000)
    return a, b, tmp_path / "data"


def _take(source, a, data, dataset_id="d1", checkpoint=lambda _name: None):
    return snapshot.take(str(source), [f"{a}/"], data, dataset_id, checkpoint)


def _left(data) -> list[str]:
    root = data / snapshot.SNAPSHOTS
    return sorted(os.listdir(root)) if root.exists() else []


def test_a_snapshot_is_the_files_spark_reads_copied(tree):
    a, _, data = tree
    taken = _take(a / "weeks", a, data)
    assert taken.location == "sources/d1"
    assert [(f.path, f.size) for f in taken.files] == [("part-00.parquet", 1000), ("year=2020/part-01.parquet", 10)]
    assert taken.files[0].sha256 == hashlib.sha256(b"A" * 1000).hexdigest()
    copy = data / "sources" / "d1"
    assert (copy / "part-00.parquet").read_bytes() == b"A" * 1000
    assert sorted(os.listdir(copy)) == ["part-00.parquet", "year=2020"]  # _SUCCESS, .crc, _spark_metadata skipped
    assert stat.S_IMODE(os.stat(copy).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(copy / "part-00.parquet").st_mode) == 0o600
    again = _take(f"file://{a}/weeks", a, data, "d2")  # a file: URI; the same files, the same fingerprint
    assert again.sha256 == taken.sha256 and _left(data) == ["d1", "d2"]
    single = _take(a / "weeks" / "part-00.parquet", a, data, "d3")  # one file: copied under its name
    assert [f.path for f in single.files] == ["part-00.parquet"] and single.sha256 != taken.sha256


def test_a_prefix_the_operator_gave_through_a_link_is_followed(tree, tmp_path):
    a, _, data = tree
    (tmp_path / "a-link").symlink_to(a, target_is_directory=True)  # the operator's configuration is trusted
    taken = snapshot.take(f"{tmp_path}/a-link/weeks", [f"{tmp_path}/a-link"], data, "d1")
    assert len(taken.files) == 2


@pytest.mark.parametrize("case", ["file link", "directory link inside", "link in the middle", "the source a link",
                                  "fifo inside", "the source a fifo"])
def test_links_and_special_files_are_refused(tree, case):
    a, b, data = tree
    source = a / "weeks"
    if case == "file link":  # even a link to a file of the same source
        (a / "weeks" / "part-02.parquet").symlink_to(a / "weeks" / "part-00.parquet")
    elif case == "directory link inside":
        (a / "weeks" / "year=2021").symlink_to(b / "secret", target_is_directory=True)
    elif case == "link in the middle":
        (a / "middle").symlink_to(b, target_is_directory=True)
        source = a / "middle" / "secret"
    elif case == "the source a link":
        (a / "mine").symlink_to(b / "secret", target_is_directory=True)
        source = a / "mine"
    elif case == "fifo inside":
        os.mkfifo(a / "weeks" / "part-03.parquet")
    else:
        os.mkfifo(a / "pipe")
        source = a / "pipe"
    with pytest.raises(LabelDPError) as refused:
        _take(source, a, data)
    assert refused.value.code == "source_not_allowed", refused.value
    assert str(data) not in str(refused.value) and str(b) not in str(refused.value)
    assert _left(data) == []  # no snapshot, no temporary directory


@pytest.mark.parametrize("location", ["s3a://bucket/a/weeks", "hdfs://namenode/a/weeks", "file://elsewhere{a}/weeks",
                                      "{a}-other/weeks", "{a}/weeks/../../b/secret"])
def test_only_local_locations_under_the_prefix(tree, location):
    a, _, data = tree
    with pytest.raises(LabelDPError) as refused:
        _take(location.format(a=a), a, data)
    assert refused.value.code == "source_not_allowed"
    assert _left(data) == []


def test_missing_and_empty_sources_are_refused(tree):
    a, _, data = tree
    with pytest.raises(LabelDPError) as missing:
        _take(a / "nothing", a, data)
    (a / "empty" / "_temporary").mkdir(parents=True)
    with pytest.raises(LabelDPError) as empty:
        _take(a / "empty", a, data)
    assert (missing.value.code, empty.value.code) == ("source_not_found", "empty_labels")
    assert "nothing" not in str(missing.value) and str(a) not in str(missing.value)
    assert _left(data) == []


class SwapAt:
    """A checkpoint that changes the source once, at the named point of the snapshot."""

    def __init__(self, name, change):
        self.name, self.change, self.done = name, change, False

    def __call__(self, name):
        if name == self.name and not self.done:
            self.done = True
            time.sleep(0.05)  # file times tick with the kernel's clock (a few ms): not within the tick of the write
            self.change()


def _swap_for_link(path, target):
    """Atomically replace ``path`` by a link to ``target`` (a link made aside, then renamed over it)."""
    aside = path.with_name(".swap")
    aside.symlink_to(target)
    os.replace(aside, path)


def test_a_file_swapped_for_a_link_after_the_listing_is_refused(tree):
    a, b, data = tree
    decoy = a / "weeks" / "part-00.parquet"
    swap = SwapAt("source_listed", lambda: _swap_for_link(decoy, b / "secret" / "part-00.parquet"))
    with pytest.raises(LabelDPError) as refused:
        _take(a / "weeks", a, data, checkpoint=swap)
    assert swap.done and refused.value.code == "source_not_allowed" and "symbolic link" in str(refused.value)
    assert _left(data) == []


def test_a_file_swapped_or_written_while_it_is_copied_is_refused(tree):
    a, b, data = tree
    decoy = a / "weeks" / "part-00.parquet"
    swap = SwapAt("source_opened", lambda: _swap_for_link(decoy, b / "secret" / "part-00.parquet"))
    with pytest.raises(LabelDPError) as swapped:  # the opened file (A's) was unlinked: its change time moved
        _take(a / "weeks", a, data, checkpoint=swap)
    assert swap.done and swapped.value.code == "source_not_allowed" and "changed" in str(swapped.value)
    assert _left(data) == []

    decoy.unlink()
    decoy.write_bytes(b"A" * 1000)

    def rewrite_keeping_size_and_time():  # same length, modification time set back: the change time still moves
        status = os.stat(decoy)
        with open(decoy, "r+b") as handle:
            handle.write(b"B" * 1000)
        os.utime(decoy, ns=(status.st_atime_ns, status.st_mtime_ns))

    rewrite = SwapAt("source_opened", rewrite_keeping_size_and_time)
    with pytest.raises(LabelDPError) as rewritten:
        _take(a / "weeks", a, data, checkpoint=rewrite)
    assert rewrite.done and rewritten.value.code == "source_not_allowed"
    assert _left(data) == []


def test_a_copy_keeps_no_empty_directory_and_stops_at_its_room_or_entries(tree, monkeypatch):
    """Issue 40's 33rd review: 20,000 empty directories were copied (82.4 MB of the disk, 20,003 inodes, counted as
    14 KB), and a source that grew after its request was copied whole. A copy keeps only directories with a file
    Spark reads, takes at least a block for each file and directory it makes, and stops — leaving nothing — past
    the bytes it may take or :data:`snapshot.MAX_ENTRIES` entries."""
    from shared.service.storage_quota import tree_bytes

    a, _, data = tree
    for k in range(50):
        (a / "weeks" / f"empty-{k}" / "deeper").mkdir(parents=True)
    taken = _take(a / "weeks", a, data)
    copy = data / "sources" / "d1"
    assert sorted(os.listdir(copy)) == ["part-00.parquet", "year=2020"] and len(taken.files) == 2
    assert tree_bytes(copy) >= 3 * 4096  # two files and a directory: at least a block each, not their 1,010 bytes
    room = 2 * 4096 + 1000  # the first file and its block, a directory's block, not the second file's
    with pytest.raises(LabelDPError) as refused:
        snapshot.copy(str(a / "weeks"), [f"{a}/"], data, "d2", room=room)
    assert refused.value.code == "storage_quota_exceeded" and _left(data) == ["d1"]
    assert snapshot.copy(str(a / "weeks"), [f"{a}/"], data, "d3", room=room + 4096 + 10).files == taken.files
    monkeypatch.setattr(snapshot, "MAX_ENTRIES", 40)
    with pytest.raises(LabelDPError, match="more than 40 files and directories") as many:
        snapshot.copy(str(a / "weeks"), [f"{a}/"], data, "d4")
    assert many.value.code == "malformed_file"


def test_a_sources_expected_size_is_what_its_copy_keeps_and_its_entries_are_bounded(tree, monkeypatch):
    """Issue 40's 34th review: a dataset's creation walked its source whole (300,000 entries) under SQLite's write
    lock, holding every organization's writes for 1.2 s a request, and counted empty directories and files at 0
    bytes. The walk now comes before any lock, keeps what the copy keeps (no empty directory, no ``_``/``.``
    name, a block at least an entry) and stops at :data:`snapshot.MAX_ENTRIES`."""
    from shared.service.storage_quota import tree_bytes

    a, _, data = tree
    for k in range(30):
        (a / "weeks" / f"empty-{k}").mkdir()
    expected = snapshot.expected_size(str(a / "weeks"))
    _take(a / "weeks", a, data)
    kept = tree_bytes(data / "sources" / "d1")
    assert kept <= expected <= kept + 3 * 4096, (kept, expected)
    monkeypatch.setattr(snapshot, "MAX_ENTRIES", 20)
    with pytest.raises(LabelDPError, match="more than 20 files and directories"):
        snapshot.expected_size(str(a / "weeks"))
