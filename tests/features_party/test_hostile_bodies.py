"""The trainer's bodies bounded by what they decode to (issue 40): an id list's ids are counted before it is parsed
(any key uploads one; 60 MB of short ids took the trainer up by 1.3 GB), and a job's JSON body over the decoded
limit is refused before it is parsed."""

from __future__ import annotations

from tests.features_party.test_api import trainer_client, trainer_context


def test_an_id_list_over_its_ids_is_refused_before_it_is_parsed(tmp_path):
    ctx = trainer_context(tmp_path, "http://127.0.0.1:9", start=False, max_id_list_ids=1000)
    trainer = trainer_client(ctx, "publisher", "member")  # any key uploads an id list
    headers = {"Content-Type": "text/csv"}
    over = "example_id\n" + "".join(f"u{i}\n" for i in range(1001))
    answer = trainer.put("/v1/id-lists/h", content=over, headers=headers)
    assert answer.status_code == 413 and answer.json()["error"]["code"] == "body_too_large", answer.text
    assert "1,001 lines of ids" in answer.json()["error"]["message"]
    assert trainer.get("/v1/id-lists").json() == []
    # lines a lone \r ends count too (issue 40's eleventh review: 7.5 million of them passed a limit of a million)
    carriage = "example_id\r" + "".join(f"u{i}\r" for i in range(1001))
    answer = trainer.put("/v1/id-lists/h", content=carriage, headers=headers)
    assert answer.status_code == 413 and "1,001 lines of ids" in answer.json()["error"]["message"], answer.text
    assert trainer.get("/v1/id-lists").json() == []
    at = "example_id\n" + "".join(f"u{i}\n" for i in range(999)) + "u999"  # the last line without its newline
    assert trainer.put("/v1/id-lists/h", content=at, headers=headers).json()["num_ids"] == 1000
    full = "example_id\r\n" + "".join(f"u{i}\r\n" for i in range(1000))  # exactly the limit, CRLF-ended
    assert trainer.put("/v1/id-lists/h", content=full, headers=headers).json()["num_ids"] == 1000


def test_a_jobs_json_body_over_the_decoded_limit_is_refused_before_it_is_parsed(tmp_path):
    ctx = trainer_context(tmp_path, "http://127.0.0.1:9", start=False, max_json_decoded_bytes=1 << 20)
    trainer = trainer_client(ctx, "publisher")
    body = b'{"features": "f", "numeric": [' + b",".join([b"[0]"] * 20_000) + b"], not json"
    answer = trainer.post("/v1/jobs", content=body, headers={"Content-Type": "application/json"})
    assert answer.status_code == 413 and answer.json()["error"]["code"] == "body_too_large", answer.text
    assert trainer.get("/v1/jobs").json() == []


def test_csv_records_and_columns_beyond_the_limits_are_refused_before_they_are_parsed(tmp_path):
    """Issue 40's eleventh review: one 200 MB cell (or 10⁸ quoted line breaks) of a features table was read whole
    (+1,219 MB), a 60 MB id of an id list too (+609 MB), and a header of 120,000 columns took 45 s of CPU. A record
    is at most max_csv_record_bytes, a header at most max_feature_columns columns: 413 before any parsing."""
    ctx = trainer_context(tmp_path, "http://127.0.0.1:9", start=False, max_csv_record_bytes=64 << 10,
                          max_feature_columns=50)
    admin, member = trainer_client(ctx, "publisher"), trainer_client(ctx, "publisher", "member")
    headers = {"Content-Type": "text/csv"}
    bodies = {
        ("/v1/features/f", "max_csv_record_bytes"): "example_id,x\nu1," + "7" * (65 << 10) + "\nu2,1\n",
        ("/v1/features/g", "max_csv_record_bytes"): 'example_id,c\nu1,"' + "\n" * (65 << 10) + '"\nu2,a\n',
        ("/v1/features/h", "max_feature_columns"): "example_id," + ",".join(f"c{i}" for i in range(50)) + "\n",
        ("/v1/id-lists/l", "max_csv_record_bytes"): "example_id\nu" + "x" * (65 << 10) + "\n",
    }
    for (path, limit), body in bodies.items():
        answer = member.put(path, content=body, headers=headers) if "id-lists" in path else \
            admin.put(path, content=body, headers=headers)
        assert answer.status_code == 413 and answer.json()["error"]["code"] == "body_too_large", (path, answer.text)
        assert limit in answer.json()["error"]["message"]
    assert admin.get("/v1/features").json() == [] and member.get("/v1/id-lists").json() == []
    fits = "example_id," + ",".join(f"c{i}" for i in range(49)) + "\nu1," + ",".join(["1"] * 49) + "\n"
    assert admin.put("/v1/features/ok", content=fits, headers=headers).status_code == 200
    ctx.close()


def test_a_header_is_read_before_pandas_parses_the_body(tmp_path, monkeypatch):
    """The twelfth review: the header was parsed by pandas before its columns were counted — 1 MiB of commas took
    +4.2 GB and 118 s of CPU before its 413, 60,000 repeated names 37 s — and an id list's header not counted at
    all. Too many names (413), a repeated name (400) and an id list of two columns (400) are refused from the
    header's bytes: pandas is never called."""
    import pandas as pd

    ctx = trainer_context(tmp_path, "http://127.0.0.1:9", start=False, max_feature_columns=50)
    admin, member = trainer_client(ctx, "publisher"), trainer_client(ctx, "publisher", "member")
    headers = {"Content-Type": "text/csv"}

    def parsed(*_args, **_kwargs):
        raise AssertionError("pandas parsed a body refused from its header")

    monkeypatch.setattr(pd, "read_csv", parsed)
    refused = {
        ("/v1/features/f", 413, "body_too_large"): "example_id" + "," * 200_000 + "\n",
        ("/v1/features/g", 400, "malformed_file"): "example_id," + ",".join(["a"] * 40) + "\nu1" + ",1" * 40 + "\n",
        ("/v1/features/q", 400, "malformed_file"): '"example_id","x,y","x,y"\nu1,1,2\n',
        ("/v1/id-lists/l", 400, "malformed_file"): "example_id,x\nu1,1\n",
        ("/v1/id-lists/m", 400, "malformed_file"): "example_id" + "," * 30_000 + "\n",
        # pandas skips lines of spaces and tabs before a header: so does the check (the next review's bypass)
        ("/v1/features/b", 413, "body_too_large"): "\n \t\r\n\r" + "example_id" + "," * 200_000 + "\n",
        ("/v1/features/c", 400, "malformed_file"): "\ufeff\n" + "example_id," + ",".join(["a"] * 40) + "\n",
        ("/v1/id-lists/n", 400, "malformed_file"): " \n" + "example_id" + "," * 30_000 + "\n",
    }
    for (path, status, code), body in refused.items():
        client = member if "id-lists" in path else admin
        answer = client.put(path, content=body, headers=headers)
        assert (answer.status_code, answer.json()["error"]["code"]) == (status, code), (path, answer.text)
    monkeypatch.undo()
    assert admin.get("/v1/features").json() == [] and member.get("/v1/id-lists").json() == []
    ctx.close()


def test_an_id_list_of_lines_ended_by_turns_in_cr_and_lf_is_counted_whole(tmp_path):
    """The twelfth review: lines were counted as 1 + max(\\n, \\r), so ids ended by turns in a lone \\r and a lone
    \\n were counted at half — 2·10⁶ ids stored past a limit of 10⁶ (+684 MB)."""
    ctx = trainer_context(tmp_path, "http://127.0.0.1:9", start=False, max_id_list_ids=1000)
    member = trainer_client(ctx, "publisher", "member")
    mixed = "example_id\n" + "".join(f"u{i}" + ("\r" if i % 2 else "\n") for i in range(1001))
    answer = member.put("/v1/id-lists/h", content=mixed, headers={"Content-Type": "text/csv"})
    assert answer.status_code == 413 and "1,001 lines of ids" in answer.json()["error"]["message"], answer.text
    at = "example_id\r\n" + "".join(f"u{i}" + ("\r" if i % 3 == 0 else "\n" if i % 3 == 1 else "\r\n")
                                    for i in range(1000))
    assert member.put("/v1/id-lists/h", content=at, headers={"Content-Type": "text/csv"}).json()["num_ids"] == 1000
    ctx.close()
