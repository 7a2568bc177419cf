"""A features upload is stored in bounded memory (issue 40): read in chunks, checked, written row group by row group
(:func:`features_party.features.store_features`) — and stored as the whole-file read stored it
(:func:`read_features` then :func:`store_frame`, kept for id lists): the same Parquet schema, pandas' metadata
included, and the same rows; the same refusals with the same codes."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from features_party import features
from features_party.features import CsvLimits, read_features, store_features, store_frame
from features_party.planning import load_frame
from shared.errors import LabelDPError
from tests.features_party.test_api import trainer_client, trainer_context

LIMITS = CsvLimits(max_record_bytes=1 << 20, max_columns=4_000)  # the trainer's defaults

# pandas' own chunks (low_memory): the largest power of two under half of 2^20 // columns rows
B3, B5 = 262_144, 131_072  # for 3 columns, for 5


def _body(tmp_path: Path, text: str | bytes) -> Path:
    spool = tmp_path / "spool"
    spool.mkdir(exist_ok=True)
    path = spool / "body"
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


def _whole(path: Path, directory: Path) -> Path | str:
    """What the upload stored before issue 40 (or the code it refused with)."""
    try:
        return store_frame(directory, "whole", read_features(path))
    except LabelDPError as err:
        return err.code


def _streamed(path: Path, directory: Path) -> features.StoredTable | str:
    try:
        return store_features(path, directory, "streamed", LIMITS)
    except LabelDPError as err:
        return err.code


def _assert_stored_alike(whole: Path, streamed: features.StoredTable) -> None:
    before, after = pq.ParquetFile(whole), pq.ParquetFile(streamed.file)
    assert after.schema_arrow.equals(before.schema_arrow, check_metadata=True), (before.schema_arrow,
                                                                                  after.schema_arrow)
    assert after.read().equals(before.read())
    columns = before.schema_arrow.names
    pd.testing.assert_frame_equal(load_frame(str(streamed.file), columns), load_frame(str(whole), columns))
    assert streamed.num_examples == before.metadata.num_rows
    assert streamed.columns == before.schema_arrow.names


@pytest.mark.filterwarnings("ignore::pandas.errors.DtypeWarning")  # the whole read, reference
def test_a_csv_of_pandas_chunks_whose_types_differ_is_stored_as_pandas_reads_it_whole(tmp_path, monkeypatch):
    """Four of pandas' own chunks, read one at a time: integers then a missing value (float64: written again), a
    text column with a chunk of no value (text throughout, as pandas' reader types it), floats then a chunk of
    integers (cast on the way), booleans then a chunk of no value (object)."""
    monkeypatch.setattr(features, "CHUNK_BYTES", 1)  # one of pandas' chunks at a time
    assert features._chunk_rows(5, 20.0) == B5
    B = B5
    rows = 4 * B + 17
    i = np.arange(rows)
    frame = pd.DataFrame({
        "example_id": [f"u{k}" for k in i],
        "count": np.where(i == 2 * B + 5, "", i.astype(str)),
        "city": np.where((i >= B) & (i < 2 * B), "", np.array(["oslo", "lima", "pune"])[i % 3]),
        "score": np.where(i < B, (i + 0.5).astype(str), i.astype(str)),
        "flag": np.where(i < 3 * B, np.where(i % 2 == 0, "True", "False"), ""),
    })
    path = _body(tmp_path, frame.to_csv(index=False))
    whole, streamed = _whole(path, tmp_path / "a"), _streamed(path, tmp_path / "b")
    assert isinstance(whole, Path) and isinstance(streamed, features.StoredTable)
    _assert_stored_alike(whole, streamed)
    stored = pd.read_parquet(streamed.file)
    assert {c: str(t) for c, t in stored.dtypes.items()} == {
        "example_id": "str", "count": "float64", "city": "str", "score": "float64", "flag": "object"}
    assert pq.ParquetFile(streamed.file).metadata.num_row_groups == pq.ParquetFile(whole).metadata.num_row_groups


def test_many_small_chunks_in_small_row_groups_store_the_rows_pandas_reads(tmp_path, monkeypatch):
    monkeypatch.setattr(features, "_chunk_rows", lambda columns, row_bytes, longest=0, long_bytes=None: 1000)
    monkeypatch.setattr(features, "ROW_GROUP_BYTES", 50_000)
    rng = np.random.default_rng(3)
    rows = 25_000
    frame = pd.DataFrame({"example_id": [f"id-{k:06d}" for k in rng.permutation(rows)],
                          "x0": rng.normal(size=rows), "x1": rng.integers(-5, 5, size=rows),
                          "c": rng.choice(["a", "b", "c, with a comma", 'a "quote"'], size=rows)})
    path = _body(tmp_path, frame.to_csv(index=False))
    streamed = store_features(path, tmp_path / "b", "f", LIMITS)
    _assert_stored_alike(store_frame(tmp_path / "a", "f", read_features(path)), streamed)
    assert pq.ParquetFile(streamed.file).metadata.num_row_groups > 5
    pd.testing.assert_frame_equal(pd.read_parquet(streamed.file), pd.read_csv(path, dtype={"example_id": str}))
    assert not list((tmp_path / "b").glob(".*.tmp")) and not list(path.parent.glob("ids-*"))  # nothing left over


def _rows(n: int, row) -> str:
    return "".join(row(k) for k in range(n))


MALFORMED = {
    "no id column": "id,x0\n1,2\n",
    "duplicate in a chunk": "example_id,x0\n1,2\n1,3\n",
    "duplicate across chunks": "example_id,x0\n" + _rows(5000, lambda k: f"u{k % 3001},{k}\n"),
    "duplicate last row": "example_id,x0\n" + _rows(5000, lambda k: f"u{k},{k}\n") + "u17,0\n",
    "missing id in a later chunk": "example_id,x0\n" + _rows(5000, lambda k: f"{'' if k == 4321 else k},1\n"),
    "bad row in a later chunk": "example_id,x0\n" + _rows(5000, lambda k: f"u{k},1\n") + "u,1,2,3\n",
    "invalid utf-8 in a later chunk": b"example_id,x0\n" + _rows(5000, lambda k: f"u{k},1\n").encode() + b"\xff,1\n",
    "duplicate and a bad row": "example_id,x0\nu1,1\nu1,2\n" + _rows(5000, lambda k: f"v{k},1\n") + "u,1,2,3\n",
    "invalid utf-8": b"example_id,x0\n\xff\xfe,1\n",
    "empty": b"",
    "blank lines": b"\n\n",
    "parquet": b"PAR1\x00\x01\x02 not a csv",
    "open quote": b'example_id,x0\n"open,1\n',
    "extra fields": b"example_id,x0\na,1,2,3\nb,1\n",
    "one column, not ids": b"x0\n1\n",
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_malformed_uploads_are_refused_with_the_codes_of_a_whole_read(tmp_path, monkeypatch, name):
    monkeypatch.setattr(features, "_chunk_rows", lambda columns, row_bytes, longest=0, long_bytes=None: 1000)
    path = _body(tmp_path, MALFORMED[name])
    code = _streamed(path, tmp_path / "b")
    assert code == _whole(path, tmp_path / "a") and code in ("malformed_file", "duplicate_example_id")
    assert not (tmp_path / "b").exists() or not list((tmp_path / "b").iterdir())  # nothing stored, nothing left


def test_the_duplicate_named_is_pandas_first_one(tmp_path, monkeypatch):
    monkeypatch.setattr(features, "_chunk_rows", lambda columns, row_bytes, longest=0, long_bytes=None: 1000)
    body = "example_id,x0\n" + _rows(4000, lambda k: f"u{k},1\n") + "u3500,1\nu12,1\n"
    path = _body(tmp_path, body)
    with pytest.raises(LabelDPError) as refused:
        store_features(path, tmp_path / "b", "f", LIMITS)
    with pytest.raises(LabelDPError) as whole:
        read_features(path)
    assert str(refused.value) == str(whole.value) == "duplicate example_id 'u3500' in features"


@pytest.mark.parametrize("duplicate", [None, 2950, 5999])
def test_colliding_hashes_are_compared_as_strings(tmp_path, monkeypatch, duplicate):
    """With a hash of 50 values (thousands of collisions, across partitions and verification batches of two groups),
    distinct ids are stored and a repeated one is the one named."""
    monkeypatch.setattr(features, "_chunk_rows", lambda columns, row_bytes, longest=0, long_bytes=None: 700)
    monkeypatch.setattr(features, "PART_ROWS", 1000)
    monkeypatch.setattr(features, "VERIFY_GROUPS", 2)
    monkeypatch.setattr(features._Ids, "HASH", staticmethod(lambda text: sum(map(ord, text)) % 50))
    ids = [f"u{k * 7919 % 6000}" for k in range(6000)]
    if duplicate is not None:
        ids[duplicate] = ids[duplicate // 3]
    path = _body(tmp_path, "example_id,x0\n" + "".join(f"{i},1\n" for i in ids))
    outcome = _streamed(path, tmp_path / "b")
    if duplicate is None:
        assert isinstance(outcome, features.StoredTable) and outcome.num_examples == 6000
    else:
        with pytest.raises(LabelDPError) as refused:
            store_features(path, tmp_path / "c", "f", LIMITS)
        assert str(refused.value) == f"duplicate example_id {ids[duplicate]!r} in features"


def test_a_column_of_numbers_then_text_is_a_400_not_a_500(tmp_path, monkeypatch):
    """pandas types the two chunks apart (int64, then text): the table read whole holds both in an object column,
    which Parquet cannot (to_parquet's ArrowInvalid was a 500)."""
    monkeypatch.setattr(features, "CHUNK_BYTES", 1)
    path = _body(tmp_path, "example_id,x,c\n" + _rows(2 * B3, lambda k: f"u{k},1,{'a' if k >= B3 else 1}\n"))
    with pytest.raises(LabelDPError) as refused:
        store_features(path, tmp_path / "b", "f", LIMITS)
    assert refused.value.code == "malformed_file"
    assert "a column holds values of different kinds" in str(refused.value)
    assert not list((tmp_path / "b").iterdir())


def test_an_upload_of_many_chunks_answers_and_stores_what_it_did(tmp_path, monkeypatch):
    monkeypatch.setattr(features, "_chunk_rows", lambda columns, row_bytes, longest=0, long_bytes=None: 500)
    ctx = trainer_context(tmp_path, "http://127.0.0.1:9", start=False)
    trainer = trainer_client(ctx, "publisher")
    frame = pd.DataFrame({"example_id": [f"u{k}" for k in range(3000)], "x0": np.arange(3000) / 7,
                          "c": ["a", "b", "c"] * 1000})
    frame.loc[2600, "x0"] = np.nan
    answer = trainer.put("/v1/features/f", content=frame.to_csv(index=False), headers={"Content-Type": "text/csv"})
    assert answer.status_code == 200, answer.text
    assert answer.json()["num_examples"] == 3000 and answer.json()["columns"] == ["example_id", "x0", "c"]
    stored = load_frame(str(next((ctx.data_dir).rglob("f.parquet"))), ["x0", "c"])
    expected = pd.read_csv(io.StringIO(frame.to_csv(index=False)), dtype={"example_id": str})
    pd.testing.assert_frame_equal(stored, expected.set_index("example_id", drop=False))
    duplicate = frame.to_csv(index=False) + "u7,1,a\n"
    refused = trainer.put("/v1/features/g", content=duplicate, headers={"Content-Type": "text/csv"})
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "duplicate_example_id"
    assert [t["name"] for t in trainer.get("/v1/features").json()] == ["f"]


MEASURE = textwrap.dedent("""
    import io, json, sys
    from pathlib import Path
    import pandas as pd, pyarrow.parquet  # noqa: F401  (loaded before the baseline)
    from features_party.features import CsvLimits, store_features

    def kb(field):
        for line in open("/proc/self/status"):
            if line.startswith(field + ":"):
                return int(line.split()[1])
    pd.read_csv(io.BytesIO(b"example_id,x\\nu1,1\\n"))
    body = Path(sys.argv[1])
    baseline = kb("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    stored = store_features(body, body.parent.parent / "stored", "f", CsvLimits(1 << 20, 10_000))
    print(json.dumps({"growth_mb": (kb("VmHWM") - baseline) / 1024, "rows": stored.num_examples}))
""")


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="peak RSS is read from /proc (Linux)")
def test_a_large_csv_of_short_rows_is_stored_within_a_bounded_peak_rss(tmp_path):
    """40 MB of short rows (what took a whole read to ~0.75 GB; the 60 MB of issue 40's bench to +1.16 GB): the
    peak resident memory of a process storing it — pandas' C parser, Arrow and numpy all counted — grows by less
    than 160 MB (~100 MB measured at 60 MB)."""
    spool = tmp_path / "spool"
    spool.mkdir()
    body, size, start = spool / "body", 40 << 20, 0
    with open(body, "w") as out:
        out.write("example_id,x\n")
        while out.tell() < size:
            out.write("".join(f"u{k},1\n" for k in range(start, start + 100_000)))
            start += 100_000
    answer = subprocess.run([sys.executable, "-c", MEASURE, str(body)], capture_output=True, text=True, check=True,
                            cwd=Path(__file__).resolve().parents[2])
    measured = json.loads(answer.stdout)
    assert measured["rows"] == start
    assert measured["growth_mb"] < 160, measured


@pytest.mark.parametrize("ending", ["\n", "\r\n", "\r"])
def test_lines_are_counted_whatever_ends_them(tmp_path, ending):
    """The duplicate check sizes its partitions from the line count: a body ended by lone \\r counted as one line
    put every row in one partition, read whole (+602 MB for a 120 MB body, against +131 MB with \\n)."""
    body = tmp_path / "body"
    body.write_bytes(("example_id,x" + ending + "".join(f"e{i},{i}{ending}" for i in range(1000))).encode())
    records = features.scan_records(body, piece=777)  # pieces that cut records
    assert records.lines == 1002  # a header, 1,000 rows, and what follows the last ending
    assert records.longest == len("example_id,x")  # a \r\n ends a record at its \r (the \n: an empty one)


@pytest.mark.parametrize("piece", [1, 3, 64, 1 << 20])
def test_the_longest_record_counts_quoted_line_breaks_in_its_field(tmp_path, piece):
    """A record ends at a line break outside quotes: a field of quoted line breaks is one record, a doubled quote
    inside a field is a quote (issue 40's eleventh review: a 200 MB cell of line breaks was read whole)."""
    body = tmp_path / "body"
    field = '"' + "a\n\r\n" * 50 + '""b""' + '"'  # 156 + 7 bytes between its quotes
    body.write_bytes(("example_id,x\n" + f"u1,{field}\n" + "u2,3\n").encode())
    records = features.scan_records(body, piece=piece)
    assert records.longest == len(f"u1,{field}")
    assert records.lines == 1 + body.read_bytes().count(b"\n")  # what pandas' line count bounds


@pytest.mark.parametrize("piece", [1, 2, 5, 1 << 20])
def test_a_quote_inside_an_unquoted_field_is_found_whatever_the_pieces(tmp_path, piece):
    """pandas reads a quote inside an unquoted field as a character, so counting quotes alone would take
    `a"b,"…"` for two short fields and miss the long quoted one after it: such a body is misquoted (refused).
    Quoting as writers do (whole fields, inner quotes doubled, after a byte-order mark too) is not."""
    hidden, honest = tmp_path / "hidden", tmp_path / "honest"
    hidden.write_bytes(b'example_id,c\nu1,a"b,"' + b"\n" * 5000 + b'"\nu2,x\n')
    honest.write_bytes(b'\xef\xbb\xbf"example_id",c\r\nu1,"a,b"\r\nu2,"5"""\r\nu3,""\r\n')
    assert features.scan_records(hidden, piece=piece).misquoted
    assert not features.scan_records(honest, piece=piece).misquoted
    assert read_features(honest)["c"].tolist() == ["a,b", '5"', np.nan]


def test_a_misquoted_features_body_is_refused_before_it_is_parsed(tmp_path):
    ctx = trainer_context(tmp_path, "http://127.0.0.1:9", start=False)
    trainer = trainer_client(ctx, "publisher")
    body = 'example_id,c\nu1,a"b,"' + "\n" * (2 << 20) + '"\nu2,x\n'  # a 2 MiB field past the 1 MiB record limit
    answer = trainer.put("/v1/features/f", content=body, headers={"Content-Type": "text/csv"})
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "malformed_file", answer.text
    assert "quote" in answer.json()["error"]["message"] and trainer.get("/v1/features").json() == []
    ctx.close()


def test_long_records_are_read_in_chunks_bounded_by_the_longest(tmp_path, monkeypatch):
    """The review of the twelfth round's fixes: 300 rows of 1 MB cells were one pandas chunk (+1,388 MB). A chunk
    holds at most CHUNK_MAX_BYTES of the body's longest record; the table stored is the one a whole read stores."""
    assert features._chunk_rows(3, 1e6, 1 << 20) == 16 and features._chunk_rows(3, 20.0, 64) == features._chunk_rows(
        3, 20.0)
    rows = 200
    body = "example_id,x,note\n" + "".join(f"u{k},{k},{'n' * (200_000 + k)}\n" for k in range(rows))
    path = _body(tmp_path, body)
    chunks = []
    original = features._chunks

    def counted(*args):
        for chunk in original(*args):
            chunks.append(len(chunk))
            yield chunk

    monkeypatch.setattr(features, "_chunks", counted)
    streamed = store_features(path, tmp_path / "b", "f", LIMITS)
    assert max(chunks) <= features.CHUNK_MAX_BYTES // 200_000 and sum(chunks) == rows
    pd.testing.assert_frame_equal(pd.read_parquet(streamed.file), pd.read_csv(path, dtype={"example_id": str}))


@pytest.mark.parametrize("piece", [777, 1 << 20])
def test_one_long_record_among_short_ones_leaves_chunks_large(tmp_path, piece):
    """The fourteenth review: one 530 KB cell among 42,000 short rows bounded every chunk by that record (2,600
    chunks, 3.5 s of CPU). The records longer than LONG_RECORD are counted apart: when they fill at most half a
    chunk all together, chunks hold up to half a chunk of short records besides; 300 records of 1 MB still make
    chunks of 16 rows."""
    body = tmp_path / "body"
    long_cell = "y" * 530_000
    body.write_bytes(("example_id,x\n" + "".join(f"e{i},{i}\n" for i in range(42_000)) + f"e-long,{long_cell}\n"
                      ).encode())
    records = features.scan_records(body, piece=piece)
    assert records.long_bytes == len(f"e-long,{long_cell}") and records.longest == records.long_bytes
    rows = features._chunk_rows(2, body.stat().st_size / records.lines, records.longest, records.long_bytes)
    assert rows >= features.CHUNK_MAX_BYTES // 2 // features.LONG_RECORD // 2  # a power of two at least half that
    assert rows * features.LONG_RECORD + records.long_bytes <= features.CHUNK_MAX_BYTES
    many = features._chunk_rows(2, 1e6, 1 << 20, 300 << 20)
    assert many * (1 << 20) <= features.CHUNK_MAX_BYTES
