"""JSON bodies are bounded by what they decode to, before they are parsed (issue 40, item 7): the gate's JsonCost
is an upper bound of the memory decoding and validating a hostile body takes; a body over the per-request limit is
413 body_too_large before it is parsed, one the process's budget cannot cover is 503 server_busy with Retry-After;
and a live server's peak RSS stays within the limit for a 30 MB body of the review's shape."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import tracemalloc
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import BaseModel, ValidationError

import labels_party.http.api as api
from features_party import schemas as trainer_schemas
from labels_party.http.auth import create_key
from labels_party.runtime.context import make_context
from labels_party.runtime.settings import LabelsSettings
from shared import schemas
from shared.errors import RetryLater
from shared.service.budgets import ByteBudget
from shared.service.gate import JsonCost, _first_invalid_string, read_json_body
from shared.service.scratch import Scratch


def _repeat(prefix: str, item: str, suffix: str, count: int) -> bytes:
    return (prefix + ",".join([item] * count) + suffix).encode()


COUNT = 100_000
SHAPES: list[tuple[str, type[BaseModel], bytes]] = [
    ("features of one zero", schemas.CentralTrainingRequest,
     _repeat('{"epsilon": 1, "example_ids": ["a", "b"], "features": [', "[0]", "]}", COUNT)),
    ("features of empty lists", schemas.CentralTrainingRequest,
     _repeat('{"epsilon": 1, "example_ids": ["a", "b"], "features": [', "[]", "]}", COUNT)),
    ("valid features", schemas.CentralTrainingRequest,
     b'{"epsilon": 1, "example_ids": ' + json.dumps([f"u{i}" for i in range(COUNT)]).encode() +
     _repeat(', "features": [', "[0.5, 1.5]", "]}", COUNT)),
    ("features of strings", schemas.CentralTrainingRequest,
     _repeat('{"epsilon": 1, "example_ids": ["a", "b"], "features": [', '["x"]', "]}", COUNT)),
    ("predictions", schemas.EvaluationRequest,
     _repeat('{"metric": "mse", "epsilon": 1, "example_ids": ["a"], "predictions": [', "0.5", "]}", COUNT)),
    ("short ids", schemas.ReleaseRequest,
     b'{"mechanism": "rr", "epsilon": 1, "example_ids": ' + json.dumps([f"u{i}" for i in range(COUNT)]).encode()
     + b"}"),
    ("empty ids", schemas.ReleaseRequest, _repeat('{"mechanism": "rr", "epsilon": 1, "example_ids": [', '""', "]}",
                                                  COUNT)),
    ("long ids", schemas.ReleaseRequest,
     b'{"mechanism": "rr", "epsilon": 1, "example_ids": ' + json.dumps([f"{'x' * 40}{i}" for i in range(COUNT)]
                                                                       ).encode() + b"}"),
    ("ids of UCS-4 characters", schemas.ReleaseRequest,
     b'{"mechanism": "rr", "epsilon": 1, "example_ids": ' + json.dumps(
         [f"\U0001F600{'x' * 12}{i}" for i in range(COUNT)], ensure_ascii=True).encode() + b"}"),
    ("ids of objects", schemas.ReleaseRequest, _repeat('{"mechanism": "rr", "epsilon": 1, "example_ids": [', "{}",
                                                       "]}", COUNT)),
    ("ids of numbers", schemas.QuantilesRequest, _repeat('{"quantiles": [0.5], "epsilon": 1, "example_ids": [', "7",
                                                         "]}", COUNT)),
    ("values of lists", schemas.FiniteDatasetCreate,
     _repeat('{"name": "n", "label_kind": "finite", "epsilon_total": 1, "values": [', "[0]", "]}", COUNT)),
    ("an object of many keys", schemas.ReleaseRequest,
     ('{"mechanism": "rr", "epsilon": 1, ' + ", ".join(f'"k{i}": 0' for i in range(COUNT)) + "}").encode()),
    ("the trainer's example ids", trainer_schemas.JobRequest,
     b'{"features": "f", "dataset_id": "d", "api_key": "k", "release": {"mechanism": "rr", "epsilon": 1, '
     b'"example_ids": ' + json.dumps([f"u{i}" for i in range(COUNT)]).encode() + b"}}"),
    ("the trainer's numeric columns", trainer_schemas.JobRequest,
     _repeat('{"features": "f", "dataset_id": "d", "api_key": "k", "numeric": [', "[0]", "]}", COUNT)),
]


def _decode(model: type[BaseModel], body: bytes) -> None:
    """What the service does with a JSON body before a route's own work: FastAPI's json.loads, the gate's checks,
    pydantic's validation (its errors converted as FastAPI converts them), the request dumped and written as
    canonical JSON (the ledger's record)."""
    value = json.loads(body)
    if _first_invalid_string(value) is not None:
        return
    try:
        request = model.model_validate(value)
    except ValidationError as err:
        err.errors(include_url=False)
        return
    json.dumps(request.model_dump(mode="json"), sort_keys=True)


def peaks_of_every_shape() -> dict[str, int]:
    """Each shape's tracemalloc peak while it decodes (the least of two measurements)."""
    peaks = {}
    for name, model, body in SHAPES:
        measured = []
        for _ in range(2):
            tracemalloc.start()
            try:
                _decode(model, body)
                measured.append(tracemalloc.get_traced_memory()[1])
            finally:
                tracemalloc.stop()
        peaks[name] = min(measured)
    return peaks


@pytest.fixture(scope="module")
def decoding_peaks() -> dict[str, int]:
    """The peaks measured in a fresh interpreter: tracemalloc counts every thread's allocations, and late in a long
    session the threads earlier tests left behind (servers winding down, JAX's) added 8 MB to every measurement of
    one shape in CI — the process's, not decoding's."""
    code = ("import json; from tests.shared.service.test_decode_budget import peaks_of_every_shape; "
            "print(json.dumps(peaks_of_every_shape()))")
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, timeout=900,
                          env={**os.environ, "PYTHONPATH": str(root)})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("name, model, body", SHAPES, ids=[s[0] for s in SHAPES])
def test_the_cost_bounds_what_decoding_takes(name, model, body, decoding_peaks):
    cost = JsonCost()
    for start in range(0, len(body), 1 << 16):  # counted as chunks arrive
        cost.add(body[start:start + (1 << 16)])
    # the cost and the joined copy of the body the gate holds, against what Python allocated beyond the body
    assert cost.total >= 1.25 * decoding_peaks[name], (name, cost.describe(), decoding_peaks[name])


def test_a_failing_list_gives_one_error_not_one_per_element():
    """fail_fast: 10⁵ wrong ids are one error (each was ~700 bytes of Python, beyond what JsonCost counts)."""
    with pytest.raises(ValidationError) as refused:
        schemas.ReleaseRequest.model_validate({"mechanism": "rr", "epsilon": 1, "example_ids": [{}] * COUNT})
    assert len(refused.value.errors()) == 1
    with pytest.raises(ValidationError) as refused:
        schemas.CentralTrainingRequest.model_validate({"epsilon": 1, "example_ids": ["a", "b"],
                                                       "features": [["x"]] * COUNT})
    assert len(refused.value.errors()) == 1


@pytest.fixture()
def labels(tmp_path):
    def client(**settings):
        ctx = make_context(f"sqlite:///{tmp_path}/db.sqlite", tmp_path / "data", settings=LabelsSettings(**settings))
        with ctx.sessions() as session, session.begin():
            key = create_key(ctx.ledger, session, "owner", "admin")
        app = api.create_app(ctx)
        headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        test = TestClient(app)
        dataset = test.post("/v1/datasets", headers=headers, json={
            "name": "d", "label_kind": "integer", "min": 0, "max": 9, "epsilon_total": 1}).json()["id"]
        return test, app, headers, dataset
    return client


def test_a_body_over_the_decoded_limit_is_refused_before_it_is_parsed(labels):
    """1 MiB of decoded size: a body of [[0], …] costs ~110 bytes per byte; this one is not even JSON after its
    first 100 KB — were it parsed, it would be a 422 json_invalid."""
    client, _app, headers, dataset = labels(max_json_decoded_bytes=1 << 20, json_decode_budget_bytes=8 << 20)
    body = _repeat('{"epsilon": 1, "example_ids": ["a", "b"], "features": [', "[0]", "", 25_000) + b"not json"
    answer = client.post(f"/v1/datasets/{dataset}/central-trainings", content=body,
                         headers={**headers, "Idempotency-Key": "a"})
    assert answer.status_code == 413 and answer.json()["error"]["code"] == "body_too_large", answer.text
    assert "max_json_decoded_bytes" in answer.json()["error"]["message"]
    assert client.get(f"/v1/datasets/{dataset}/budget", headers=headers).json()["epsilon_spent"] == 0.0
    assert client.get(f"/v1/datasets/{dataset}/releases", headers=headers).json() == []
    small = client.post(f"/v1/datasets/{dataset}/central-trainings", content=b"not json",
                        headers={**headers, "Idempotency-Key": "b"})
    assert small.status_code == 422  # within the limit, the body is parsed (and refused as it is)


def test_a_body_the_budget_cannot_cover_waits_then_is_503(labels):
    client, app, headers, dataset = labels(max_json_decoded_bytes=1 << 20, json_decode_budget_bytes=2 << 20,
                                           json_decode_wait_seconds=0.3)
    budget: ByteBudget = app.state.decode_budget
    assert (budget.total, budget.per_request) == (2 << 20, 1 << 20)
    assert budget.try_take((2 << 20) - 1000)  # other bodies hold all but 1,000 bytes
    body = json.dumps({"mechanism": "rr", "epsilon": 1.0, "example_ids": [f"u{i}" for i in range(100)]}).encode()
    answer = client.post(f"/v1/datasets/{dataset}/releases", content=body, headers={**headers, "Idempotency-Key": "c"})
    assert answer.status_code == 503 and answer.json()["error"]["code"] == "server_busy", answer.text
    assert int(answer.headers["Retry-After"]) >= 1
    budget.give((2 << 20) - 1000)
    answer = client.post(f"/v1/datasets/{dataset}/releases", content=body, headers={**headers, "Idempotency-Key": "c"})
    assert answer.json()["error"]["code"] == "no_labels", answer.text  # decoded: the dataset has no labels yet
    assert budget.used == 0  # every share given back


def test_an_object_of_many_keys_is_refused_before_validation(labels):
    client, _app, headers, dataset = labels()
    body = ('{"mechanism": "rr", "epsilon": 1, ' + ", ".join(f'"k{i}": 0' for i in range(1000)) + "}").encode()
    answer = client.post(f"/v1/datasets/{dataset}/releases", content=body, headers={**headers, "Idempotency-Key": "d"})
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "invalid_input", answer.text
    assert "1,002 keys" in answer.json()["error"]["message"]


def test_every_route_with_a_body_documents_its_refusals(labels, tmp_path):
    """413 (the body, or what it decodes to) and 503 (server_busy) are in every route's OpenAPI responses, on both
    services."""
    from features_party.api import create_app as create_trainer
    from tests.features_party.test_api import trainer_context

    _client, app, _headers, _dataset = labels()
    trainer = create_trainer(trainer_context(tmp_path / "trainer", "http://127.0.0.1:9", start=False))
    for spec in (app.openapi(), trainer.openapi()):
        operations = [(path, method, operation) for path, methods in spec["paths"].items()
                      for method, operation in methods.items() if method in ("post", "put")]
        assert len(operations) >= 3
        for path, method, operation in operations:
            assert {"413", "503"} <= set(operation["responses"]), (method, path)
            assert "decodes to" in operation["responses"]["413"]["description"]


def test_a_live_servers_memory_stays_within_the_limit(tmp_path):
    """The review's shape, 30 MB of [[0], [0], …] on central training, in a process of its own: refused 413 while
    its peak RSS grows by well under the 192 MiB limit (it grew by ~1.7 GB per 30 MB)."""
    probe = textwrap.dedent(f"""
        import re, sys
        from fastapi.testclient import TestClient
        import labels_party.http.api as api
        from labels_party.http.auth import create_key
        from labels_party.runtime.context import make_context

        def kb(name):
            return int(re.search(name + r":\\s+(\\d+)", open("/proc/self/status").read()).group(1))

        ctx = make_context("sqlite:///{tmp_path}/db.sqlite", "{tmp_path}/data")
        with ctx.sessions() as session, session.begin():
            key = create_key(ctx.ledger, session, "owner", "admin")
        client = TestClient(api.create_app(ctx))
        headers = {{"Authorization": "Bearer " + key, "Content-Type": "application/json"}}
        dataset = client.post("/v1/datasets", headers=headers, json={{
            "name": "d", "label_kind": "integer", "min": 0, "max": 9, "epsilon_total": 1}}).json()["id"]
        body = b'{{"epsilon": 1, "example_ids": ["a", "b"], "features": [' + b",".join([b"[0]"] * 7_500_000) + b"]}}"
        client.post(f"/v1/datasets/{{dataset}}/central-trainings", content=b"{{}}", headers=headers)  # loads the route
        open("/proc/self/clear_refs", "w").write("5")
        before = kb("VmRSS")
        answer = client.post(f"/v1/datasets/{{dataset}}/central-trainings", content=body,
                             headers={{**headers, "Idempotency-Key": "x"}})
        print(answer.status_code, answer.json()["error"]["code"], (kb("VmHWM") - before) // 1024)
    """)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=600)
    status, code, growth_mb = done.stdout.split()[-3:]
    assert (status, code) == ("413", "body_too_large"), done.stdout + done.stderr
    # the body itself is 30 MB (the test client holds it too); decoding it would take gigabytes
    assert int(growth_mb) < 128, done.stdout


def _receiver(chunks: list[bytes]):
    messages = [{"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1}
                for i, chunk in enumerate(chunks)]

    async def receive():
        return messages.pop(0)
    return receive


def test_a_json_body_holds_no_share_while_it_streams_and_waits_for_it_when_complete():
    """Bodies that held their share as their bytes came let slow senders hold the budget for minutes (the
    twenty-third and twenty-fourth reviews: 677,900 bytes of brackets, 192 MiB counted, then a byte every 15 s). A
    body holds nothing while it streams in; complete, it takes its cost, waiting (holding nothing) for it."""
    import anyio

    body = json.dumps({"mechanism": "rr", "epsilon": 1.0, "example_ids": [f"u{i}" for i in range(2000)]}).encode()
    cost = JsonCost()
    cost.add(body)
    budget = ByteBudget(total=4 << 20, per_request=2 << 20, wait_seconds=5)
    assert budget.try_take((4 << 20) - 20_000)  # other requests hold all but 20,000 bytes; one ends soon
    seen: list[int] = []
    chunks = [body[:100], body[100:]]

    async def receive():
        seen.append(budget.used)  # nothing of this body's is held while it streams
        chunk = chunks.pop(0)
        return {"type": "http.request", "body": chunk, "more_body": bool(chunks)}

    threading.Timer(0.3, budget.give, ((2 << 20),)).start()
    read, held = anyio.run(read_json_body, receive, budget)
    assert seen == [(4 << 20) - 20_000] * 2
    assert read == body and held == cost.total + cost.size and budget.used == (2 << 20) - 20_000 + held
    budget.give(held)
    budget.give((2 << 20) - 20_000)
    assert budget.used == 0


def test_one_organizations_json_bodies_hold_at_most_its_share():
    """The twenty-third review: four connections of one organization, each sending 677,900 bytes of brackets (192
    MiB counted) and then a byte every 20 s, held the whole budget for 11 minutes while another organization's
    requests were 503. An organization's bodies hold at most half the budget (``limits.json_budget``)."""
    import anyio

    from shared.service.limits import json_budget

    budget = json_budget(LabelsSettings(max_json_decoded_bytes=1 << 20, json_decode_budget_bytes=4 << 20,
                                        json_decode_wait_seconds=0.2))
    assert (budget.total, budget.per_request, budget.per_owner) == (4 << 20, 1 << 20, 2 << 20)
    assert budget.try_take(2 << 20, owner=1)  # the first organization's slow bodies hold their whole share
    body = json.dumps({"mechanism": "rr", "epsilon": 1.0, "example_ids": [f"u{i}" for i in range(100)]}).encode()
    with pytest.raises(RetryLater):
        anyio.run(read_json_body, _receiver([body]), budget, 1)
    read, held = anyio.run(read_json_body, _receiver([body]), budget, 2)  # another organization's: room left
    assert read == body and budget.owners == {1: 2 << 20, 2: held}
    budget.give(held, 2)
    budget.give(2 << 20, 1)
    assert budget.used == 0 and budget.owners == {}


def test_a_streaming_json_body_is_spooled_not_held_in_memory(tmp_path):
    """The twenty-fifth review: bodies kept in memory while they streamed let one organization's 240 slow
    connections of 22 MB each grow the trainer by 5.2 GB. A body streams to an unnamed file in the spool directory
    and is read back once complete and paid for."""
    import anyio

    chunks = [b'{"name": "'] + [b"a" * (1 << 20)] * 20 + [b'"}']
    budget = ByteBudget(total=1 << 30, per_request=512 << 20, wait_seconds=1)
    growth: list[int] = []
    pending = list(chunks)

    async def receive():
        growth.append(tracemalloc.get_traced_memory()[0])
        chunk = pending.pop(0)
        return {"type": "http.request", "body": chunk, "more_body": bool(pending)}

    scratch = Scratch(tmp_path)
    tracemalloc.start()
    try:
        read, held = anyio.run(read_json_body, receive, budget, None, scratch)
    finally:
        tracemalloc.stop()
    assert read == b"".join(chunks) and budget.used == held
    assert max(growth) - growth[0] < 4 << 20  # 20 MiB came in; at most a chunk or two was ever held
    assert list(scratch.spools.iterdir()) == []  # the file had no name, and is gone
    assert scratch.spool_budget.used == 0  # and its disk is given back
