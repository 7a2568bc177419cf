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
