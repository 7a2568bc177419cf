"""The ledger's state as coverage classes, per organization's account: per-example spent units equal the sum over
the releases covering each example (checked against a plain per-example sum), the state does not grow with the
number of releases, events with δ > 0 compose through their RDP curves (as the accountant composes them, not by
adding ε), and verify-audit recomputes every example's budget from the records over the HTTP service."""

from __future__ import annotations

import dp_accounting
import numpy as np
import pytest
from dp_accounting.rdp import RdpAccountant
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import create_engine
from sqlalchemy.orm import sessionmaker

from labels_party.http.api import create_app
from labels_party.http.audit import verify_audit
from labels_party.http.auth import create_key
from labels_party.ledger import RDP_ORDERS, Actor, BudgetExceeded, Charge, Ledger, RecordFields, units_epsilon
from labels_party.runtime.context import make_context
from labels_party.store import db, labelstore
from labels_party.store.storage import DataStore
from shared.errors import LabelDPError
from shared.mechanisms import events


class _Books:
    """A real database (SQLite in memory) with one dataset and one account, and the ledger over a data directory."""

    def __init__(self, root, registry_size: int = 0, epsilon_units: int = 10**12, delta: float = 0.0):
        engine = create_engine("sqlite://")
        db.Base.metadata.create_all(engine)
        self.sessions = sessionmaker(engine, expire_on_commit=False)
        self.ledger = Ledger(DataStore(root))
        with self.sessions() as session, session.begin():
            session.add(db.Organization(id=1, name="owner"))
            session.add(db.Dataset(id="d", owner_org_id=1, name="d", label_kind="integer", domain_json="{}",
                                   epsilon_total_units=epsilon_units, epsilon_spent_units=0, delta_total=delta,
                                   registry_size=registry_size, ledger_seq=0, ledger_head="0" * 64))
            account = db.BudgetAccount(dataset_id="d", org_id=1, epsilon_units=epsilon_units, delta=delta,
                                       generation=0, spent_max_units=0)
            session.add(account)
            session.flush()
            dataset = session.get(db.Dataset, "d")  # opened on the chain, as labels_party/releases/datasets.py does
            self.ledger.dataset_budget(session, dataset)
            self.ledger.allocation(session, dataset, account)
            self.ledger.account_opened(session, dataset, 1)
        self.ledger.confirm(self.rows()[0])

    def grow(self, examples: int) -> None:
        with self.sessions() as session, session.begin():
            session.get(db.Dataset, "d").registry_size += examples

    def rows(self):
        with self.sessions() as session:
            return session.get(db.Dataset, "d"), session.query(db.BudgetAccount).one()

    def charge(self, covered: np.ndarray, charge: Charge | tuple[dp_accounting.DpEvent, float]) -> tuple[str, ...]:
        """Charge a pure ``Charge(units)`` (as a randomizer's event of that ε) or an (event, requested ε)."""
        event, epsilon = charge if isinstance(charge, tuple) else (
            events.LocalRandomizerDpEvent(mechanism="rr", epsilon=units_epsilon(charge.units)),
            units_epsilon(charge.units))
        with self.sessions() as session, session.begin():
            dataset = session.get(db.Dataset, "d")
            coverage = labelstore.coverage_of(self.ledger.store, "d", covered)
            superseded = self.ledger.charge(session, "d", 1, coverage, event, epsilon, RecordFields(
                release_id=f"r{dataset.ledger_seq + 1}", created_at="2026-01-01T00:00:00",
                actor=Actor(org="owner", role="admin"), mechanism="rr", request={}, label_version=1)).superseded
            labelstore.keep(self.ledger.store, coverage)  # admitted: stored, as the release transaction does
        self.ledger.confirm(self.rows()[0])
        for old in superseded:
            self.ledger.store.remove(old)
        return superseded

    def spent(self) -> np.ndarray:
        dataset, account = self.rows()
        return self.ledger.spent_vector(account, dataset.registry_size)


@settings(max_examples=30, deadline=None)
@given(st.data())
def test_classes_equal_the_per_example_sum(tmp_path_factory, data):
    """Random registries that grow between releases, random subsets and charges: the class state expands to the
    plain per-example sum; examples covered by the same releases always share a class (so there are never more
    classes than distinct coverage histories), and a charge that splits classes leaves one class per distinct
    spent value."""
    books = _Books(tmp_path_factory.mktemp("ledger"))
    registry_size, expected, history = 0, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=object)
    for release in range(data.draw(st.integers(1, 8))):
        grow = data.draw(st.integers(0, 40))
        books.grow(grow)
        registry_size += grow
        expected = np.append(expected, np.zeros(grow, dtype=np.int64))
        history = np.append(history, np.zeros(grow, dtype=object))
        if registry_size == 0:
            continue
        covered = np.array(sorted(data.draw(st.sets(st.integers(0, registry_size - 1), min_size=1))))
        units = data.draw(st.integers(1, 3)) * 10**8  # small values: equal sums (merges) happen often
        classes_before = books.rows()[1].classes_file
        books.charge(covered, Charge(units))
        expected[covered] += units
        history[covered] += 1 << release  # the set of releases covering each example, as a bit mask
        assert books.spent().tolist() == expected.tolist()
        dataset, account = books.rows()
        assert dataset.epsilon_spent_units == account.spent_max_units == expected.max()
        state = books.ledger.state(account, registry_size)
        assert state.units.size <= len(set(history.tolist()))
        classes = state.block(0, registry_size)
        for mask in set(history.tolist()) - {0}:  # never covered: a class, or fresh if uploaded since the split
            assert np.unique(classes[history == mask]).size == 1
        if account.classes_file != classes_before:  # rewritten: canonical, one class per value
            assert state.units.tolist() == np.unique(expected).tolist()
        spent, sizes = books.ledger.spent_classes(account, registry_size)
        assert sizes.sum() == registry_size
        assert sorted(np.repeat(spent, sizes).tolist()) == sorted(expected.tolist())


def test_the_state_does_not_grow_with_releases(tmp_path):
    """200 releases of the same 10⁵ examples: one coverage file, one class file (written once), one small table;
    superseded tables are removed."""
    books = _Books(tmp_path, registry_size=100_000)
    everyone = np.arange(100_000)
    for _ in range(200):
        books.charge(everyone, Charge(10**7))
    files = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert len([f for f in files if "/coverage/" in f]) == 1
    assert len([f for f in files if "/budget/" in f]) == 3  # the class file, the current and the previous table
    dataset, account = books.rows()
    assert books.ledger.state(account, dataset.registry_size).units.tolist() == [200 * 10**7]
    assert account.classes_file.endswith("classes_00000001.npy")  # only the first release split (fresh → charged)


def test_a_charge_over_the_budget_changes_nothing(tmp_path):
    books = _Books(tmp_path, registry_size=10, epsilon_units=10**9)
    books.charge(np.arange(5), Charge(7 * 10**8))
    before = (books.rows()[1].spent_file, books.rows()[1].classes_file, books.rows()[0].ledger_seq,
              books.spent().tolist())
    with pytest.raises(BudgetExceeded) as refused:
        books.charge(np.arange(3, 8), Charge(4 * 10**8))
    assert refused.value.remaining_units == 3 * 10**8
    assert (books.rows()[1].spent_file, books.rows()[1].classes_file, books.rows()[0].ledger_seq,
            books.spent().tolist()) == before
    books.charge(np.arange(5, 10), Charge(10**9))  # the untouched half still has its whole budget
    assert books.spent().tolist() == [7 * 10**8] * 5 + [10**9] * 5


def _training(steps: int = 50) -> dp_accounting.DpEvent:
    """One DP-SGD run's event, as LabelDP-Pro's (noise multiplier σ/2 = 0.8, q = 0.02)."""
    return dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
        0.02, dp_accounting.GaussianDpEvent(0.8)), steps)


def test_gaussian_events_compose_as_the_accountant_says(tmp_path):
    """n trainings on the same examples cost what dp-accounting's RDP accountant says n of them cost at the
    account's δ — far less than n times one — rounded up, never down; trainings on other examples cost them
    nothing; and pure events add to them by basic composition."""
    delta, n = 1e-6, 40
    books = _Books(tmp_path, registry_size=100, epsilon_units=10**12, delta=delta)
    one = (_training(), 1.0)
    alone = RdpAccountant(orders=list(RDP_ORDERS))
    alone.compose(_training())
    for _ in range(n):
        books.charge(np.arange(50), one)
    together = RdpAccountant(orders=list(RDP_ORDERS))
    together.compose(dp_accounting.SelfComposedDpEvent(_training(), n))
    spent = books.spent()
    composed = units_epsilon(int(spent[0]))
    assert together.get_epsilon(delta) <= composed <= together.get_epsilon(delta) + 1e-7
    assert composed < 0.25 * n * alone.get_epsilon(delta)  # not a sum of ε
    assert (spent[50:] == 0).all()
    books.charge(np.arange(25, 75), Charge(3 * 10**8))  # a pure ε = 0.3 release over half of each
    after = books.spent()
    assert after[25:50].tolist() == [int(spent[0]) + 3 * 10**8] * 25
    assert after[:25].tolist() == spent[:25].tolist() and after[50:75].tolist() == [3 * 10**8] * 25


def test_the_issue_26_attack_is_charged_its_epsilon_at_the_accounts_delta(tmp_path):
    """One step at ε = 0.001 calibrated for δ = 0.0099 is ε ≈ 0.058 at δ = 10⁻⁵ (the issue's figure); charged at
    an account's δ of 10⁻⁵ it costs that, and 1000 of them cost what the accountant composes (≈ 2.39, not 1.0)."""
    from labels_party.core import labeldp_pro

    sigma = labeldp_pro.calibrate_sigma(0.001, 0.0099, 1.0, 1, "noop")
    event = labeldp_pro.dp_event(sigma, 1.0, 1, "noop")
    books = _Books(tmp_path, registry_size=10, epsilon_units=10**11, delta=1e-5)
    books.charge(np.arange(10), (event, 0.001))
    assert units_epsilon(int(books.spent()[0])) == pytest.approx(0.058, abs=5e-4)
    for _ in range(999):
        books.charge(np.arange(10), (event, 0.001))
    assert units_epsilon(int(books.spent()[0])) == pytest.approx(2.39, abs=0.01)
    assert events.epsilon_of(dp_accounting.SelfComposedDpEvent(event, 1000), 1e-5) == pytest.approx(2.39, abs=0.01)


def test_verify_audit_recomputes_budgets_over_the_service(tmp_path):
    """Whole-version releases, a subset release and a re-upload with new ids; then a tampered class table is
    found."""
    ctx = make_context(f"sqlite:///{tmp_path}/db.sqlite", tmp_path / "data")
    with ctx.sessions() as session, session.begin():
        key = create_key(ctx.ledger, session, "hospital", "admin")
    client = TestClient(create_app(ctx), raise_server_exceptions=False)
    auth = {"Authorization": f"Bearer {key}"}
    dataset = client.post("/v1/datasets", headers=auth, json={
        "name": "d", "label_kind": "integer", "min": 0, "max": 9, "epsilon_total": 10}).json()["id"]

    def upload(ids):
        body = "example_id,label\n" + "".join(f"e{i},{i % 10}\n" for i in ids)
        response = client.put(f"/v1/datasets/{dataset}/labels", content=body,
                              headers={**auth, "Content-Type": "text/csv"})
        assert response.status_code == 200, response.text
        return response.json()

    def release(key, **extra):
        response = client.post(f"/v1/datasets/{dataset}/releases", headers={**auth, "Idempotency-Key": key},
                               json={"mechanism": "rr", "epsilon": 0.5, **extra})
        assert response.status_code == 201, response.text

    upload(range(100))
    release("a")
    release("b")
    release("c", example_ids=[f"e{i}" for i in range(10)])
    assert upload(range(50, 150))["new_examples"] == 50
    release("d")
    report = verify_audit(ctx)
    assert report["valid"], report
    assert report["datasets"][0]["epsilon_spent"] == 1.5
    with ctx.sessions() as session, session.begin():
        row = session.get(db.Dataset, dataset)
        account = session.query(db.BudgetAccount).filter_by(dataset_id=dataset).one()
        spent = ctx.ledger.spent_vector(account, row.registry_size)
        assert spent[:10].tolist() == [1_500_000_000] * 10  # a, b, c
        assert spent[10:50].tolist() == [1_000_000_000] * 40  # a, b
        assert spent[50:100].tolist() == [1_500_000_000] * 50  # a, b, d
        assert spent[100:150].tolist() == [500_000_000] * 50  # d
        forged = ctx.store.read_array(account.spent_file)  # (units, size, spent) per class
    forged[0, 2] -= 1  # a spent column that no longer follows from the units
    ctx.store.write_array(account.spent_file, forged)
    assert "hospital: a class's spent epsilon is not its units and curve at the account's delta" in \
        verify_audit(ctx)["datasets"][0]["problems"]
    forged[0, 0] -= 1  # and units that no longer follow from the records
    ctx.store.write_array(account.spent_file, forged)
    assert "hospital: per-example spent units differ from the records" in verify_audit(ctx)["datasets"][0][
        "problems"]
    audit = client.get("/v1/audit", headers=auth).json()
    ctx.store.remove(audit["events"][2]["record"]["coverage"]["file"])  # release c's coverage, lost
    problems = verify_audit(ctx)["datasets"][0]["problems"]  # reported, not a crash
    seq = audit["events"][2]["seq"]
    assert any(p.startswith(f"seq {seq}: coverage file") and p.endswith("missing or damaged") for p in problems), \
        problems


def test_a_charge_below_its_events_epsilon_is_refused_and_changes_nothing(tmp_path):
    """The ledger recomputes ε from the record it is about to append: an event of ε = 0.5 charged as 0.3 (a kind
    that priced itself wrong) is refused before anything is written, and the account is as it was."""
    books = _Books(tmp_path, registry_size=10, epsilon_units=10**10, delta=0.0)
    books.charge(np.arange(10), Charge(10**8))
    seq = books.rows()[0].ledger_seq
    event = events.LocalRandomizerDpEvent(mechanism="rr", epsilon=0.5)
    with pytest.raises(LabelDPError) as refused:
        books.charge(np.arange(10), (event, 0.3))
    assert refused.value.code == "certification_failed"
    assert books.spent().tolist() == [10**8] * 10
    assert books.rows()[0].ledger_seq == seq  # nothing appended
    books.charge(np.arange(10), (event, 0.5))  # charged what it costs, it is admitted
    assert books.spent().tolist() == [6 * 10**8] * 10
