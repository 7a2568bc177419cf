"""Prior and group bodies share one process budget (issue 40: four honest group bodies at the per-body limit at once
took the server +2,428 MB): each request holds what its body is counted to decode to, as it is counted, until its
release is done; a body whose share is not free in time is 503 server_busy with Retry-After, nothing charged, and
whatever it held is given back — on success, refusal and error alike."""

from __future__ import annotations

import threading
import time

import pytest
from fastapi.testclient import TestClient

from labels_party.http.api import create_app
from labels_party.http.auth import create_key
from labels_party.runtime.context import make_context
from labels_party.runtime.settings import LabelsSettings
from shared.errors import RetryLater
from shared.service.budgets import ByteBudget, Reservation
from tests.labels_party.api.helpers import bearer, expect_error, labels_csv, new_dataset, state, upload

MIB = 1 << 20


def test_a_reservation_grows_by_grains_up_to_one_requests_limit_and_is_given_back():
    budget = ByteBudget(total=64 * MIB, per_request=48 * MIB, wait_seconds=30)
    with budget.reservation() as first:
        first.hold(1)
        assert first.held == budget.grain == 16 * MIB and budget.used == 16 * MIB
        first.hold(16 * MIB)  # within what it holds: nothing more taken
        assert budget.used == 16 * MIB
        first.hold(20 * MIB)
        assert first.held == 32 * MIB
        first.hold(10**12)  # past one request's limit the caller refuses (413); the reservation stops at the limit
        assert first.held == 48 * MIB and budget.used == 48 * MIB
    assert budget.used == 0


def test_only_one_request_waits_while_holding_part_of_the_budget():
    """Requests that each held part and waited for the rest waited for one another (this bench's four honest group
    bodies at the limit: all four 503 after 10 s). One request at a time may wait holding part; another that holds
    part and needs more than is free is 503 at once (and gives back what it held), so the waiter gets it."""
    budget = ByteBudget(total=64 * MIB, per_request=48 * MIB, wait_seconds=30)
    outcome: dict[str, object] = {}
    with budget.reservation() as first:
        first.hold(32 * MIB)

        def grow_first() -> None:
            try:
                first.hold(48 * MIB)
                outcome["first"] = first.held
            except RetryLater as refused:
                outcome["first"] = refused
        waiting = threading.Thread(target=grow_first)
        with budget.reservation() as second:
            second.hold(32 * MIB)  # the budget is full, each holding part
            waiting.start()
            time.sleep(0.3)  # the first now waits, holding 32 MiB
            started = time.monotonic()
            with pytest.raises(RetryLater) as busy:
                second.hold(48 * MIB)
            assert time.monotonic() - started < 5  # at once, not after the 30 s wait
            assert busy.value.code.value == "server_busy" and busy.value.retry_after >= 1
        # the refused request's reservation ended, its 32 MiB given back: the first's wait ends with them
        waiting.join(10)
        assert outcome["first"] == 48 * MIB
    assert budget.used == 0


def test_a_reservation_waits_for_memory_another_request_gives_back():
    budget = ByteBudget(total=32 * MIB, per_request=32 * MIB, wait_seconds=10)
    assert budget.try_take(32 * MIB)
    threading.Timer(0.2, budget.give, (32 * MIB,)).start()
    with budget.reservation() as waiting:
        waiting.hold(MIB)  # holding nothing, it waits until the other request's 32 MiB are back
        assert waiting.held == 16 * MIB
    assert budget.used == 0


def test_one_request_of_an_owner_waits_for_its_own_share_and_never_takes_the_budgets_slot():
    """The twenty-second review: the one waiter slot went to a request waiting on its own organization's share, and
    another organization's growing body was 503 at once although memory came free in time; then two requests of one
    organization, each holding part of its share, were both 503. One request per owner may wait holding part for its
    own share (another of that owner holding part is 503 at once, and gives its part back); the budget's slot stays
    free for a request waiting on others' memory."""
    budget = ByteBudget(total=64 * MIB, per_request=32 * MIB, wait_seconds=30, per_owner=32 * MIB)
    outcome: dict[str, object] = {}
    with budget.reservation("a") as first:
        first.hold(16 * MIB)
        with budget.reservation("a") as second:
            second.hold(16 * MIB)  # the owner's share is full, each holding part

            def grow_second() -> None:
                try:
                    second.hold(32 * MIB)
                    outcome["second"] = second.held
                except RetryLater as refused:
                    outcome["second"] = refused
            waiting = threading.Thread(target=grow_second)
            waiting.start()
            time.sleep(0.3)  # the second waits for its owner's share, holding 16 MiB
            assert budget.claim_waiter("another owner's request")  # the budget's slot was not taken
            budget.release_waiter("another owner's request")
            started = time.monotonic()
            with pytest.raises(RetryLater, match="this organization's requests hold their share"):
                first.hold(32 * MIB)
            assert time.monotonic() - started < 5  # at once: its owner's waiter is the second
            first.budget.give(first.held, "a")  # the first's reservation ends (as its request is refused)
            first.held = 0
            waiting.join(10)
            assert outcome["second"] == 32 * MIB
    assert budget.used == 0 and budget.owners == {}


def test_one_owners_requests_hold_at_most_its_share():
    """Issue 40's twenty-first review: one organization's two bodies held the whole budget and another's one-line
    bodies were 503. An owner's requests hold at most per_owner together; another owner's still find room."""
    budget = ByteBudget(total=64 * MIB, per_request=32 * MIB, wait_seconds=0, per_owner=32 * MIB)
    with budget.reservation("a") as first, budget.reservation("a") as second, budget.reservation("b") as other:
        first.hold(32 * MIB)
        with pytest.raises(RetryLater):
            second.hold(1)  # its organization's share is held
        other.hold(32 * MIB)
        assert budget.owners == {"a": 32 * MIB, "b": 32 * MIB}
    assert budget.used == 0 and budget.owners == {}


def test_settings_refuse_a_body_limit_over_the_budget():
    with pytest.raises(ValueError, match="columnar_decode_budget_bytes"):
        LabelsSettings(max_columnar_decoded_bytes=2 << 30, columnar_decode_budget_bytes=1 << 30)


@pytest.fixture
def served(tmp_path):
    settings = LabelsSettings(max_columnar_decoded_bytes=32 * MIB, columnar_decode_budget_bytes=48 * MIB,
                              json_decode_wait_seconds=0)
    ctx = make_context(f"sqlite:///{tmp_path}/db.sqlite", tmp_path / "data", settings=settings)
    with ctx.sessions() as session, session.begin():
        admin = create_key(ctx.ledger, session, "owner", "admin")
    client = TestClient(create_app(ctx), headers=bearer(admin))
    dataset = new_dataset(client, bearer(admin), name="g", label_kind="integer", min=0, max=9, epsilon_total=5.0)
    upload(client, bearer(admin), dataset, labels_csv({f"e{i}": i % 10 for i in range(2000)}))
    yield ctx, client, dataset
    ctx.close()


def _groups(rows: int) -> str:
    return "example_id,group\n" + "".join(f"e{i},g{i % 3}\n" for i in range(rows))


def _post_groups(client, dataset, body: str, key: str):
    return client.post(f"/v1/datasets/{dataset}/group-releases", content=body,
                       params={"mechanism": "opt-unbiased", "epsilon": 1.0, "prior_epsilon": 0.25},
                       headers={"Content-Type": "text/csv", "Idempotency-Key": key})


def test_a_group_body_whose_share_is_not_free_is_503_and_charged_nothing(served):
    ctx, client, dataset = served
    budget = ctx.columnar_memory
    assert (budget.total, budget.per_request) == (48 * MIB, 32 * MIB)
    before = state(client, {}, dataset)
    assert budget.try_take(40 * MIB)  # other bodies being released hold 40 of the 48 MiB
    busy = _post_groups(client, dataset, _groups(2000), "g")
    expect_error(busy, 503, "server_busy")
    assert int(busy.headers["Retry-After"]) >= 1
    assert state(client, {}, dataset) == before
    assert budget.used == 40 * MIB  # what the refused request held is back
    budget.give(40 * MIB)
    done = _post_groups(client, dataset, _groups(2000), "g")  # the same request, once the memory is free
    assert done.status_code == 201, done.text
    assert state(client, {}, dataset)["epsilon_spent"] == 1.0
    assert budget.used == 0


def test_prior_bodies_hold_their_count_and_give_it_back_when_refused(served, monkeypatch):
    ctx, client, dataset = served
    held: list[int] = []
    hold = Reservation.hold
    monkeypatch.setattr(Reservation, "hold", lambda self, amount: (held.append(amount), hold(self, amount))[1])
    body = "example_id,p_0,p_1\n" + "".join(f"e{i},0.5,0.5\n" for i in range(1500))
    # a classes dataset for priors
    classes = new_dataset(client, {}, name="p", label_kind="classes", num_classes=2, epsilon_total=5.0)
    upload(client, {}, classes, labels_csv({f"e{i}": i % 2 for i in range(1500)}))
    made = client.post(f"/v1/datasets/{classes}/prior-releases", content=body, params={"epsilon": 1.0},
                       headers={"Content-Type": "text/csv", "Idempotency-Key": "p"})
    assert made.status_code == 201, made.text
    assert held and max(held) > 1500 * 136  # its rows were counted into the reservation
    assert ctx.columnar_memory.used == 0
    over = _post_groups(client, dataset, _groups(200_000), "big")  # 200,000 rows: the dataset has 2,000 examples
    expect_error(over, 413, "body_too_large")
    assert ctx.columnar_memory.used == 0


def test_an_organizations_bodies_hold_at_most_three_quarters_of_the_budget(served):
    """The twenty-first review: one organization's two bodies of blank lines held the whole budget for 36 s while
    another's one-line bodies were 503. Its requests now hold at most three quarters of it (here 36 MiB of 48; by
    default one body at the limit and one of a quarter of the budget): the rest stays for other organizations."""
    from sqlalchemy import select

    from labels_party.store import db

    ctx, client, dataset = served
    budget = ctx.columnar_memory
    assert budget.per_owner == 36 * MIB
    with ctx.sessions() as session:
        org = session.scalar(select(db.Organization.id).where(db.Organization.name == "owner"))
    assert budget.try_take(32 * MIB, owner=org)  # its other body holds most of its share; 16 MiB are free
    busy = _post_groups(client, dataset, _groups(2000), "own")
    expect_error(busy, 503, "server_busy")
    budget.give(32 * MIB, owner=org)
    assert _post_groups(client, dataset, _groups(2000), "own").status_code == 201
    assert budget.used == 0 and budget.owners == {}
