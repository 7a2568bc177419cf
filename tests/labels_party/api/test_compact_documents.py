"""Compact mechanism documents and requests that leave nothing behind (issue 28, items 1 and 2): a thousand
one-example groups of RRWithPrior on 256 classes publish a document under 5 MB that still says everything (each
group's exact randomizer, noisy counts and certified ε; the charged dp_event in the audit); documents round-trip
exactly through their packed form under their content address; the per-request limits refuse before the charge;
refused requests write no file. Runtime ~15 s (the thousand-group release ~4 s)."""

from __future__ import annotations

import io
import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from scipy import stats

from labels_party.http.audit import verify_audit
from labels_party.ledger import documents
from labels_party.runtime.settings import LabelsSettings
from labels_party.store import db
from shared.mechanisms import dyadic
from shared.mechanisms.randomized_response import rr_top_k
from tests.labels_party.api.helpers import admin_client

CLASSES = 256


def _groups(ids, groups) -> bytes:
    sink = io.BytesIO()
    pq.write_table(pa.table({"example_id": [str(i) for i in ids], "group": [str(g) for g in groups]}), sink)
    return sink.getvalue()


def _group_release(client, dataset, ids, groups, key, epsilon=0.002, prior_epsilon=0.001, mechanism="rr-with-prior"):
    return client.post(f"/v1/datasets/{dataset}/group-releases",
                       params={"mechanism": mechanism, "epsilon": epsilon, "prior_epsilon": prior_epsilon},
                       content=_groups(ids, groups),
                       headers={"Content-Type": "application/vnd.apache.parquet", "Idempotency-Key": key})


def _dataset(client, n: int, classes: int = CLASSES, epsilon_total: float = 1.0) -> tuple[str, np.ndarray]:
    dataset = client.post("/v1/datasets", json={"name": "c", "label_kind": "classes", "num_classes": classes,
                                                "epsilon_total": epsilon_total}).json()["id"]
    labels = np.random.default_rng(0).integers(0, classes, size=n)
    body = "example_id,label\n" + "".join(f"e{i},{v}\n" for i, v in enumerate(labels))
    assert client.put(f"/v1/datasets/{dataset}/labels", content=body,
                      headers={"Content-Type": "text/csv"}).status_code == 200
    return dataset, labels


def test_a_thousand_group_release_publishes_a_small_complete_document(tmp_path):
    ctx, client = admin_client(tmp_path)
    dataset, _ = _dataset(client, 1000)
    ids = [f"e{i}" for i in range(1000)]
    response = _group_release(client, dataset, ids, range(1000), "groups")
    assert response.status_code == 201, response.text
    release = response.json()
    with ctx.sessions() as session:
        stored = session.get(db.MechanismDocument, release["mechanism_hash"]).body
    assert len(stored) <= 5_000_000  # the bound; measured ~0.7 MB (303 MB for 2000 groups before)
    binary = client.get(f"/v1/mechanisms/{release['mechanism_hash']}",
                        headers={"Accept": documents.BINARY_MEDIA_TYPE})
    assert binary.content == stored and binary.headers["content-type"] == documents.BINARY_MEDIA_TYPE
    document = client.get(f"/v1/mechanisms/{release['mechanism_hash']}").json()
    assert documents.unpack(stored) == document and documents.address(document) == release["mechanism_hash"]
    description = document["description"]
    groups, mechanisms = description["groups"], description["mechanisms"]
    assert groups["group"] == sorted(str(g) for g in range(1000)) and groups["examples"] == [1] * 1000
    assert len(groups["noisy_counts"]) == 1000 and {len(c) for c in groups["noisy_counts"]} == {CLASSES}
    assert description["grid"] == list(range(CLASSES)) and len(mechanisms) < 1000  # distinct randomizers once
    randomizer_epsilon = release["randomizer_epsilon"]
    for index, counts in zip(groups["mechanism"], groups["noisy_counts"], strict=True):
        # each group's randomizer is RR-Top-k on the top classes of its own noisy prior, certified within ε₂
        mechanism = mechanisms[index]
        assert mechanism["certified_epsilon"] <= randomizer_epsilon
        if mechanism["mechanism"] == "rr":  # a noisy prior on which RR-Top-k would keep one class: the fallback
            assert (mechanism["fallback_from"], mechanism["reason"]) == ("rr-with-prior", "uninformative")
            continue
        assert mechanism["mechanism"] == "rr-with-prior" and len(mechanism["candidates"]) >= 2
        assert int(np.argmax(counts)) in mechanism["candidates"]
        assert dyadic.RESOLUTION // len(mechanism["candidates"]) <= mechanism["keep_count_over_2_53"]
    assert max(groups["certified_epsilon"]) == release["certified_epsilon"] <= 0.002
    record = client.get("/v1/audit", params={"dataset": dataset}).json()["events"][0]["record"]
    assert [e["type"] for e in record["dp_event"]["events"]] == ["DiscreteLaplaceDpEvent", "LocalRandomizerDpEvent"]
    assert verify_audit(ctx)["valid"]


def test_rr_top_k_samples_its_exact_distribution():
    mechanism = rr_top_k(7, [1, 4, 5], 1.2)
    e = math.exp(1.2)
    assert mechanism.matrix[1].tolist() == pytest.approx([0, e / (e + 2), 0, 0, 1 / (e + 2), 1 / (e + 2), 0])
    assert mechanism.matrix[0].tolist() == [0, 1 / 3, 0, 0, 1 / 3, 1 / 3, 0]  # a non-candidate: uniform, exactly
    assert mechanism.certified_epsilon <= 1.2 and mechanism.describe()["candidates"] == [1, 4, 5]
    rng = np.random.default_rng(1)
    for label in (0, 1, 5):
        observed = np.bincount(mechanism.sample(np.full(60_000, label), rng).astype(int), minlength=7)
        expected = mechanism.matrix[label] * 60_000
        assert observed[expected == 0].sum() == 0
        assert stats.chisquare(observed[expected > 0], expected[expected > 0]).pvalue > 1e-4


def test_packed_documents_keep_every_number_exactly():
    document = {"description": {"ints": [1, 2, 3], "floats": [1.0, 0.5], "mixed": [1, 2.5], "bools": [True, False],
                                "matrix": [[1, 2], [3, 4]], "same": [1, 2, 3], "ragged": [[1], [2, 3]],
                                "big": [2**70], "empty": [], "strings": ["a"]}, "noisy_prior": None}
    unpacked = documents.unpack(documents.pack(document))
    assert unpacked == document and documents.address(unpacked) == documents.address(document)
    assert [type(v) for v in unpacked["description"]["mixed"]] == [int, float]  # an int stays an int
    assert [type(v) for v in unpacked["description"]["floats"]] == [float, float]
    with np.load(io.BytesIO(documents.pack(document))) as archive:  # numpy reads it as an .npz
        # ints, floats, the matrix and the ragged list's two rows; [1, 2, 3] twice is stored once; mixed, bools,
        # big stay JSON
        assert sorted(archive.files) == ["a0", "a1", "a2", "a3", "a4", "document.json"]
        assert archive["a2"].tolist() == [[1, 2], [3, 4]] and archive["a0"].dtype == np.int64


def _files(root) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_refused_requests_leave_the_data_directory_unchanged(tmp_path):
    """Item 2: each refused release wrote its coverage file (1.6 MB each at the review's size) before the ledger
    refused it. Budget refusals (409), limit refusals after the coverage was computed (400) and a refused
    Idempotency-Key conflict leave exactly the files that were there."""
    ctx, client = admin_client(tmp_path / "limited")
    dataset, _ = _dataset(client, 600, classes=8, epsilon_total=1.0)
    spent = client.post(f"/v1/datasets/{dataset}/releases", headers={"Idempotency-Key": "all"},
                        json={"mechanism": "rr", "epsilon": 1.0})
    assert spent.status_code == 201
    root = tmp_path / "limited" / "data"
    before = _files(root)
    for i in range(25):  # a different subset each time: a different coverage file each time
        refused = client.post(f"/v1/datasets/{dataset}/releases", headers={"Idempotency-Key": f"r{i}"},
                              json={"mechanism": "rr", "epsilon": 0.5,
                                    "example_ids": [f"e{j}" for j in range(i, 300 + 2 * i)]})
        assert refused.status_code == 409 and refused.json()["error"]["code"] == "budget_exceeded"
    ids = [f"e{i}" for i in range(600)]
    grouped = _group_release(client, dataset, ids, np.arange(600) % 7, "g", epsilon=0.5, prior_epsilon=0.1)
    assert grouped.status_code == 409 and grouped.json()["error"]["code"] == "budget_exceeded"
    assert _files(root) == before and len(client.get("/v1/audit", params={"dataset": dataset}).json()["events"]) == 1
    ctx.close()


def test_per_request_limits_refuse_before_the_charge(tmp_path):
    from fastapi.testclient import TestClient

    from labels_party.http.api import create_app
    from labels_party.http.auth import create_key
    from labels_party.runtime.context import make_context

    ctx = make_context(f"sqlite:///{tmp_path}/db.sqlite", tmp_path / "data",
                       settings=LabelsSettings(max_groups_per_release=100, max_document_bytes=512 << 10))
    with ctx.sessions() as session, session.begin():
        key = create_key(ctx.ledger, session, "owner", "admin")
    client = TestClient(create_app(ctx), headers={"Authorization": f"Bearer {key}"})
    spec = client.get("/openapi.json").json()["paths"]["/v1/datasets/{dataset_id}/group-releases"]["post"]
    assert "At most 100 groups" in spec["description"] and "524,288 bytes" in spec["description"]
    dataset, _ = _dataset(client, 300)
    before = _files(tmp_path / "data")
    ids = [f"e{i}" for i in range(300)]
    many = _group_release(client, dataset, ids, range(300), "many")
    assert many.status_code == 400 and many.json()["error"]["code"] == "too_many_groups"
    assert "at most 100" in many.json()["error"]["message"]
    # 100 groups x (3 x 256 + 256) numbers x 8 bytes ≈ 0.8 MB: over 512 KiB (50 groups: 0.47 MB)
    large = _group_release(client, dataset, ids, np.arange(300) % 100, "large")
    assert large.status_code == 400 and large.json()["error"]["code"] == "document_too_large"
    assert _files(tmp_path / "data") == before
    assert client.get("/v1/audit", params={"dataset": dataset}).json()["events"] == []
    fits = _group_release(client, dataset, ids, np.arange(300) % 50, "fits")
    assert fits.status_code == 201, fits.text
    assert len(client.get("/v1/audit", params={"dataset": dataset}).json()["events"]) == 1
    ctx.close()


def _separators_outside_strings(text: bytes) -> tuple[int, int]:
    """The reference: a byte-by-byte JSON string state machine; (separators outside strings, longest string's
    bytes)."""
    count, inside, escaped, length, longest = 0, False, False, 0, 0
    for char in text.decode("latin-1"):
        if inside:
            escaped, inside = (False, True) if escaped else (char == "\\", char != '"')
            length += inside
            longest = max(longest, length)
        elif char == '"':
            inside, length = True, 0
        elif char in "{[,:":
            count += 1
    return count, longest


@pytest.mark.parametrize("seed", range(40))
def test_a_skeleton_counts_its_values_outside_strings_whatever_its_pieces(seed):
    """Issue 40's eighth review: group names (any 200 characters) full of { [ , : were counted as values, and an
    honest document could be refused as tampered. Only separators outside strings count, across piece ends."""
    import json
    import random
    import zipfile
    rng = random.Random(seed)
    names = ["".join(rng.choice('ab,:{["\\é') for _ in range(rng.randint(0, 30))) for _ in range(rng.randint(1, 20))]
    text = json.dumps({"description": {"groups": [{"name": n, "k": 1} for n in names]}}, separators=(",", ":"),
                      ensure_ascii=bool(seed % 2)).encode()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr(documents.SKELETON, text)
    values, longest = _separators_outside_strings(text)
    with zipfile.ZipFile(io.BytesIO(buffer.getvalue())) as archive:
        for piece in (1, 2, 3, 7, 64, 1 << 20):
            if text.isascii():
                assert documents._count_values(archive, 10**9, piece) == values, piece
            else:  # pack writes ASCII: what is not was written outside it
                with pytest.raises(documents.Unreadable, match="not ASCII"):
                    documents._count_values(archive, 10**9, piece)
    for piece in (1, 2, 3, 7, 64, 1 << 20):
        scan = documents._Scan()
        for start in range(0, len(text), piece):
            scan.add(np.frombuffer(text[start:start + piece], dtype=np.uint8))
        assert (scan.values, scan.longest, scan.inside) == (values, longest, False), piece


def _unpacked_within(skeleton: bytes, megabytes: int):
    """``documents.unpack`` of a row holding ``skeleton``: what it returned or raised, and whether its traced peak
    stayed under ``megabytes``."""
    import tracemalloc
    import zipfile
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(documents.SKELETON, skeleton)
    tracemalloc.start()
    try:
        try:
            outcome: object = documents.unpack(buffer.getvalue())
        except documents.Unreadable as err:
            outcome = err
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return outcome, peak < megabytes << 20


def test_a_skeleton_in_utf16_is_refused_before_it_is_parsed():
    """Issue 40's ninth review: json.loads(bytes) reads UTF-16, where U+2200 is the bytes 00 22 — a quote to a
    counter of UTF-8 bytes — so millions of {} inside what the counter took for strings parsed to 700 MB."""
    run = ",".join(["{}"] * 40_000)
    text = '["\u2200"' + ("," + run + ',"\u2200\u2200"') * 20 + "]"
    skeleton = text.encode("utf-16-le")
    assert len(skeleton) > 3 << 20 and text.count("{}") > documents.DEFAULT_MAX_BYTES // 64
    outcome, small = _unpacked_within(skeleton, 32)
    assert isinstance(outcome, documents.Unreadable) and small


@pytest.mark.parametrize("skeleton", [b'["' + b"a" * (8 << 20) + b'"]', b'["' + b"\\\\" * (3 << 20) + b'"]',
                                      b'["' + b"\\ud800" * (1 << 20) + b'"]'])
def test_a_long_string_is_refused_in_memory_linear_in_a_piece(skeleton):
    """The ninth review: the counter's regular expression kept a backtracking record per character of a string
    carried across pieces — an 8 KB row took 352 MB. A string longer than any document's is refused cheaply."""
    outcome, small = _unpacked_within(skeleton, 64)
    assert isinstance(outcome, documents.Unreadable) and "string longer" in str(outcome) and small


def test_a_skeleton_of_characters_outside_the_bmp_is_refused_and_an_honest_one_unpacks():
    """Issue 40's tenth review: one character outside the Basic Multilingual Plane makes a whole decoded text four
    bytes a character — a 32 KB row of 32 MiB listed parsed to 249 MB. pack writes ASCII (escapes), so a skeleton
    with any other byte was written outside it; names outside the BMP still unpack as packed (escaped)."""
    text = ('["\U0001F600' + "a" * ((1 << 20) - 64) + '"' + (',"\U0001F600' + "a" * ((1 << 20) - 64) + '"') * 8
            + "]").encode("utf-8")
    outcome, small = _unpacked_within(text, 24)
    assert isinstance(outcome, documents.Unreadable) and "not ASCII" in str(outcome) and small
    document = {"description": {"groups": [{"name": "\U0001F600 group " + "\u00e9" * i, "outputs": [0.0, float(i)]}
                                           for i in range(50)]}}
    assert documents.unpack(documents.pack(document), 8 << 20) == document


def test_a_thousand_groups_named_with_separators_unpack():
    """Names of 200 separators each, on 1,000 groups, at a document limit of 8 MiB: the values outside strings are
    few; the document unpacks as packed."""
    document = {"description": {"groups": [{"name": ":" * 200 + str(i), "outputs": [0.0, 1.0, float(i)]}
                                           for i in range(1000)]}}
    assert documents.unpack(documents.pack(document), 8 << 20) == document
