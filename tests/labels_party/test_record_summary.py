"""The one reader of stored ledger records (ledger.RecordSummary) reads every shape the ledger has written."""

from __future__ import annotations

from datetime import datetime

from labels_party.ledger import UNNAMED, RecordSummary


def test_a_current_record():
    record = {"release_id": "r1", "actor": {"org": "publisher", "role": "consumer"}, "mechanism": "rr",
              "charge_units": 250_000_000, "charge": 0.25, "rdp_units": None, "delta": 0.0,
              "examples_covered": 12, "created_at": "2026-11-25T05:00:00+00:00",
              "account": {"org": "publisher", "epsilon_units": 10**9, "delta": 0.0}, "spent_max_after_units": 7 * 10**8,
              "dp_event": {}}
    summary = RecordSummary.of(record)
    assert summary == RecordSummary("r1", "publisher", "rr", 250_000_000, 12,
                                    datetime.fromisoformat("2026-11-25T05:00:00+00:00"), "publisher", 7 * 10**8)


def test_a_record_from_before_actors_accounts_and_exact_units():
    """A float charge (2856 × 0.001 summed in floats) is read as units rounded up; who and which account are
    not made up."""
    summary = RecordSummary.of({"release_id": "r0", "mechanism": "laplace", "charge": 2.8559999999997965})
    assert (summary.org, summary.account, summary.charged_units) == (UNNAMED, "", 2_856_000_000)
    assert (summary.examples_covered, summary.created_at, summary.spent_max_after_units) == (0, None, None)
