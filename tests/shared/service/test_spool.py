"""Bodies being spooled are paid from the process's spool budget as they arrive (issue 40, the twenty-sixth review:
one organization's slow uploads filled the spool disk and held it for days while every other organization's
writes were 507): one organization's bodies hold at most half the budget, a body over that half is 507
insufficient_storage, one that finds its organization's share taken waits, then 503 server_busy; other
organizations' bodies go on; small JSON bodies take no disk; and no body streams longer than ``max_body_seconds``.

Through the labels service's ASGI app with a real context (SQLite, a data directory), bodies sent chunk by chunk."""

from __future__ import annotations

import asyncio
import itertools

import httpx
import pytest
from starlette.exceptions import HTTPException

import labels_party.http.api as api
from labels_party.http.auth import create_key
from labels_party.runtime.context import make_context
from labels_party.runtime.settings import LabelsSettings
from shared.service.limits import BodyDeadline
from shared.service.scratch import Scratch
from shared.service.spool import IN_MEMORY_BYTES

MIB = 1 << 20
HEADER, ROW = b"example_id,label\n", 11  # bytes of a row: u0000000,1


@pytest.fixture()
def service(tmp_path):
    """The labels app with an 8 MiB spool budget (4 MiB a body, 4 MiB an organization), two organizations' admin
    keys and a dataset each."""
    ctx = make_context(f"sqlite:///{tmp_path}/db.sqlite", tmp_path / "data", settings=LabelsSettings(
        spool_budget_bytes=8 * MIB, json_decode_wait_seconds=0.3))
    with ctx.sessions() as session, session.begin():
        keys = {org: create_key(ctx.ledger, session, org, "admin") for org in ("attacker", "victim")}
    app = api.create_app(ctx)
    datasets = {}

    async def setup():
        async with _client(app) as client:
            for org, key in keys.items():
                answer = await client.post("/v1/datasets", headers=_bearer(key, "application/json"), json={
                    "name": "d", "label_kind": "integer", "min": 0, "max": 9, "epsilon_total": 1})
                datasets[org] = answer.json()["id"]

    asyncio.run(setup())
    yield app, ctx.scratch.spool_budget, keys, datasets
    ctx.close()


def _client(app) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://labels", timeout=60)


def _bearer(key: str, content_type: str = "text/csv") -> dict:
    return {"Authorization": f"Bearer {key}", "Content-Type": content_type}


async def _chunks(total: int, hold: asyncio.Event | None = None, sent: asyncio.Event | None = None):
    """``total`` bytes of CSV (a header, then rows) in 64 KiB chunks; with ``hold``, all but the last chunk, then
    it waits for ``hold`` (a slow sender holding what it sent)."""
    body = HEADER + b"".join(b"u%07d,1\n" % i for i in range(_rows(total)))
    pieces = [body[i:i + (64 << 10)] for i in range(0, len(body), 64 << 10)]
    for piece in pieces[:-1]:
        yield piece
    if sent is not None:
        sent.set()
    if hold is not None:
        await hold.wait()
    yield pieces[-1]


def _rows(total: int) -> int:
    """How many rows a CSV body of at most ``total`` bytes has."""
    return (total - len(HEADER)) // ROW


def test_one_organization_holding_its_share_slows_only_itself(service):
    app, budget, keys, datasets = service
    assert (budget.total, budget.per_request, budget.per_owner) == (8 * MIB, 4 * MIB, 4 * MIB)

    async def scenario():
        hold, sent = asyncio.Event(), asyncio.Event()
        async with _client(app) as client:
            def put(org: str, body, key: str | None = None):
                return client.put(f"/v1/datasets/{datasets[org]}/labels", headers=_bearer(keys[key or org]),
                                  content=body)

            slow = asyncio.create_task(put("attacker", _chunks(4 * MIB - 100, hold, sent)))
            await sent.wait()  # the attacker's body holds its organization's whole share, and stalls
            (held,) = budget.owners.values()  # one organization's: all its share but its last chunk's 64 KiB
            assert 4 * MIB - (64 << 10) <= held <= 4 * MIB
            again = await put("attacker", _chunks(MIB))
            victim = await put("victim", _chunks(3 * MIB))
            victim_small = await client.post("/v1/datasets", headers=_bearer(keys["victim"], "application/json"),
                                             json={"name": "e", "label_kind": "integer", "min": 0, "max": 1,
                                                   "epsilon_total": 1})
            hold.set()
            return again, victim, victim_small, await slow

    again, victim, victim_small, slow = asyncio.run(scenario())
    assert again.status_code == 503 and again.json()["error"]["code"] == "server_busy", again.text
    assert "this organization's requests hold their share" in again.json()["error"]["message"]
    assert victim.status_code == 200, victim.text
    assert victim.json()["num_examples"] == _rows(3 * MIB)
    assert victim_small.status_code == 201, victim_small.text
    assert slow.status_code == 200, slow.text  # the slow body, once complete, is served
    assert budget.used == 0 and budget.owners == {}  # every share given back


def test_a_body_over_half_the_spool_is_507_and_leaves_nothing(service):
    app, budget, keys, datasets = service

    async def scenario():
        async with _client(app) as client:
            return await client.put(f"/v1/datasets/{datasets['victim']}/labels", headers=_bearer(keys["victim"]),
                                    content=_chunks(5 * MIB))

    answer = asyncio.run(scenario())
    assert answer.status_code == 507 and answer.json()["error"]["code"] == "insufficient_storage", answer.text
    assert "spool_budget_bytes" in answer.json()["error"]["message"]
    assert budget.used == 0
    spools = [p for p in app.state.ctx.scratch.spools.iterdir()]
    assert spools == []  # the partial file went with the refusal


def test_large_json_bodies_take_the_spool_small_ones_do_not(service):
    app, budget, keys, datasets = service
    seen: list[int] = []
    taken = budget.try_take

    def watching(amount, owner=None):
        seen.append(amount)
        return taken(amount, owner)

    budget.try_take = watching  # type: ignore[method-assign]
    ids = lambda n: [f"u{i:07d}" for i in range(n)]  # noqa: E731

    async def scenario():
        async with _client(app) as client:
            answers = []
            for count in (100, 20_000):  # ~1.3 KB, then ~260 KB: over IN_MEMORY_BYTES
                answers.append(await client.post(
                    f"/v1/datasets/{datasets['victim']}/releases", json={"mechanism": "rr", "epsilon": 0.5,
                                                                        "example_ids": ids(count)},
                    headers={**_bearer(keys["victim"], "application/json"), "Idempotency-Key": str(count)}))
            return answers

    small, large = asyncio.run(scenario())
    assert small.json()["error"]["code"] == large.json()["error"]["code"] == "no_labels"  # parsed, both
    # the large body took its bytes (it came in one piece; a piece under 64 KiB takes 64 KiB), not a MiB: a MiB
    # a body let 100 bodies of 70 KiB fill a 100 MiB share (the twenty-seventh review)
    assert 20_000 * 11 > IN_MEMORY_BYTES and sum(seen) == len(large.request.content)
    assert budget.used == 0


def test_a_json_body_over_half_the_spool_is_507_not_a_413(service):
    """The twenty-seventh review: past half the spool, a JSON body was refused by the route-limit check with the
    spool's half as its limit (413 'request body over 4194304 bytes')."""
    app, budget, keys, datasets = service

    async def scenario():
        async with _client(app) as client:
            return await client.post(f"/v1/datasets/{datasets['victim']}/releases", content=b'{"pad": "' + b"x" * (
                5 * MIB) + b'"}', headers={**_bearer(keys["victim"], "application/json"), "Idempotency-Key": "k"})

    answer = asyncio.run(scenario())
    assert answer.status_code == 507 and answer.json()["error"]["code"] == "insufficient_storage", answer.text
    assert budget.used == 0


def test_workers_share_the_spool_a_process_would_lend(tmp_path):
    from shared.service.limits import HttpSettings
    from shared.service.scratch import default_spool_bytes
    from shared.service.serving import spool_shares

    one = default_spool_bytes(tmp_path)
    shared = spool_shares(HttpSettings(), 4, tmp_path).spool_budget_bytes
    assert shared is not None and abs(shared - one // 4) < 16 * MIB
    assert spool_shares(HttpSettings(spool_budget_bytes=MIB), 4, tmp_path).spool_budget_bytes == MIB  # as set


def test_no_body_streams_longer_than_max_body_seconds():
    """A body that comes steadily (10 KiB a second, ten times the minimum rate) earns 10 s of allowance a second:
    without a cap it could stream for good. The fake clock advances a second per chunk."""
    clock = itertools.count()

    async def app(scope, receive, send):
        while (await receive()).get("more_body"):
            pass

    async def receive():
        return {"type": "http.request", "body": b"x" * 10240, "more_body": True}

    async def run(max_seconds: float) -> int:
        deadline = BodyDeadline(app, idle_seconds=30, min_bytes_per_second=1024, max_seconds=max_seconds,
                                clock=lambda: float(next(clock)))
        chunks = 0

        async def counting():
            nonlocal chunks
            chunks += 1
            if chunks > 1000:
                raise RuntimeError("still streaming")
            return await receive()

        with pytest.raises(HTTPException) as refused:
            await deadline({"type": "http"}, counting, None)
        assert refused.value.status_code == 408
        return chunks

    assert asyncio.run(run(60)) == 60  # 60 s of waiting allowed: the body is refused without waiting more
    with pytest.raises(RuntimeError, match="still streaming"):
        asyncio.run(run(float("inf")))


def test_the_default_spool_budget_is_half_the_free_disk(tmp_path):
    import shutil

    scratch = Scratch(tmp_path)
    free = shutil.disk_usage(tmp_path).free
    assert abs(scratch.spool_budget.total - free // 2) < 64 * MIB  # free space moves while tests run
    assert scratch.spool_budget.per_owner == scratch.spool_budget.per_request == scratch.spool_budget.total // 2
    scratch.close()
    assert Scratch(tmp_path, spool_bytes=10 * MIB).spool_budget.total == 10 * MIB
