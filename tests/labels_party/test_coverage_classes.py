"""The ledger's state as coverage classes: per-example spent units equal the sum over the releases covering each
example (checked against a plain per-example sum), the state does not grow with the number of releases, and
verify-audit recomputes every example's budget from the records over the HTTP service."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

from labels_party import labelstore
from labels_party.api import create_app
from labels_party.auth import create_key
from labels_party.ledger import BudgetExceeded, BudgetLedger
from labels_party.service import make_context, verify_audit
from labels_party.storage import DataStore


@dataclass
class _Dataset:  # the columns of db.Dataset the ledger reads and writes
    id: str = "d"
    registry_size: int = 0
    epsilon_total_units: int = 10**12
    epsilon_spent_units: int = 0
    spent_file: str | None = None
    classes_file: str | None = None
    ledger_seq: int = 0
    ledger_head: str = "0" * 64


def _fields(seq: int) -> dict:
    return {"release_id": f"r{seq}", "created_at": "2026-01-01T00:00:00", "actor": {"org": "o", "role": "admin"},
            "mechanism": "rr", "request": {}, "label_version": 1, "epsilon_requested": 1.0,
            "epsilon_certified": 1.0, "dp_event": {}, "mechanism_hash": "h"}


def _charge(ledger: BudgetLedger, dataset: _Dataset, covered: np.ndarray, units: int) -> list[str]:
    coverage = labelstore.coverage_of(ledger.store, dataset.id, covered)
    *_, superseded = ledger.charge(dataset, coverage, units, _fields(dataset.ledger_seq + 1))
    for old in superseded:
        ledger.store.remove(old)
    return superseded


@settings(max_examples=30, deadline=None)
@given(st.data())
def test_classes_equal_the_per_example_sum(tmp_path_factory, data):
    """Random registries that grow between releases, random subsets and charges: the class state expands to the
    plain per-example sum; examples covered by the same releases always share a class (so there are never more
    classes than distinct coverage histories), and a charge that splits classes leaves one class per distinct
    spent value."""
    ledger = BudgetLedger(DataStore(tmp_path_factory.mktemp("ledger")))
    dataset, expected, history = _Dataset(), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=object)
    for release in range(data.draw(st.integers(1, 8))):
        grow = data.draw(st.integers(0, 40))
        dataset.registry_size += grow
        expected = np.append(expected, np.zeros(grow, dtype=np.int64))
        history = np.append(history, np.zeros(grow, dtype=object))
        if dataset.registry_size == 0:
            continue
        covered = np.array(sorted(data.draw(st.sets(st.integers(0, dataset.registry_size - 1), min_size=1))))
        units = data.draw(st.integers(1, 3)) * 10**8  # small values: equal sums (merges) happen often
        classes_before = dataset.classes_file
        _charge(ledger, dataset, covered, units)
        expected[covered] += units
        history[covered] += 1 << release  # the set of releases covering each example, as a bit mask
        assert ledger.spent_vector(dataset).tolist() == expected.tolist()
        assert dataset.epsilon_spent_units == expected.max()
        state = ledger.state(dataset)
        assert state.spent.size <= len(set(history.tolist()))
        classes = state.block(0, dataset.registry_size)
        for mask in set(history.tolist()) - {0}:  # never covered: a class, or fresh if uploaded since the split
            assert np.unique(classes[history == mask]).size == 1
        if dataset.classes_file != classes_before:  # rewritten: canonical, one class per value
            assert state.spent.tolist() == np.unique(expected).tolist()
        spent, sizes = ledger.spent_classes(dataset)
        assert sizes.sum() == dataset.registry_size
        assert sorted(np.repeat(spent, sizes).tolist()) == sorted(expected.tolist())


def test_the_state_does_not_grow_with_releases(tmp_path):
    """200 releases of the same 10⁵ examples: one coverage file, one class file (written once), one small table;
    superseded tables are removed."""
    store = DataStore(tmp_path)
    ledger, dataset = BudgetLedger(store), _Dataset(registry_size=100_000)
    everyone = np.arange(100_000)
    for _ in range(200):
        _charge(ledger, dataset, everyone, 10**7)
    files = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert len([f for f in files if "/coverage/" in f]) == 1
    assert len([f for f in files if "/budget/" in f]) == 3  # the class file, the current and the previous table
    assert ledger.state(dataset).spent.tolist() == [200 * 10**7]
    assert dataset.classes_file.endswith("classes_00000001.npy")  # only the first release split (fresh → charged)


def test_a_charge_over_the_budget_changes_nothing(tmp_path):
    ledger, dataset = BudgetLedger(DataStore(tmp_path)), _Dataset(registry_size=10, epsilon_total_units=10**9)
    _charge(ledger, dataset, np.arange(5), 7 * 10**8)
    before = (dataset.spent_file, dataset.classes_file, dataset.ledger_seq, ledger.spent_vector(dataset).tolist())
    with pytest.raises(BudgetExceeded) as refused:
        _charge(ledger, dataset, np.arange(3, 8), 4 * 10**8)
    assert refused.value.remaining == 0.3
    assert (dataset.spent_file, dataset.classes_file, dataset.ledger_seq,
            ledger.spent_vector(dataset).tolist()) == before
    _charge(ledger, dataset, np.arange(5, 10), 10**9)  # the untouched half still has its whole budget
    assert ledger.spent_vector(dataset).tolist() == [7 * 10**8] * 5 + [10**9] * 5


def test_verify_audit_recomputes_budgets_over_the_service(tmp_path):
    """Whole-version releases, a subset release and a re-upload with new ids; then a tampered class table is
    found."""
    ctx = make_context(f"sqlite:///{tmp_path}/db.sqlite", tmp_path / "data")
    with ctx.sessions() as session, session.begin():
        key = create_key(session, "hospital", "admin")
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
        from labels_party import db

        row = session.get(db.Dataset, dataset)
        spent = ctx.ledger.spent_vector(row)
        assert spent[:10].tolist() == [1_500_000_000] * 10  # a, b, c
        assert spent[10:50].tolist() == [1_000_000_000] * 40  # a, b
        assert spent[50:100].tolist() == [1_500_000_000] * 50  # a, b, d
        assert spent[100:150].tolist() == [500_000_000] * 50  # d
        table = ctx.store.read_array(row.spent_file)
        table[0, 0] -= 1  # a forged class table
        ctx.store.write_array(row.spent_file, table)
    assert "per-example budget vector differs from the ledger" in verify_audit(ctx)["datasets"][0]["problems"]
    audit = client.get("/v1/audit", headers=auth).json()
    ctx.store.remove(audit["events"][2]["record"]["coverage"]["file"])  # release c's coverage, lost
    problems = verify_audit(ctx)["datasets"][0]["problems"]  # reported, not a crash
    assert any(p.startswith("seq 3: coverage file") and p.endswith("missing") for p in problems), problems
