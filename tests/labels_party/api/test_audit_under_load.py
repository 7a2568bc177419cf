"""verify-audit in a loop during releases on a live service is clean (issue 28, item 9: on PostgreSQL it crashed
16/16 times, superseded budget files gone under it). 120 releases here (~30 s on PostgreSQL, ~40 s on SQLite on
this 2-core machine); bench/audit_under_load.py runs the issue's 1000."""

from __future__ import annotations

from tests.support.audit_load import run


def test_verify_audit_in_a_loop_during_releases_is_clean(database_url, tmp_path):
    result = run(database_url, tmp_path, releases=120)
    assert result["errors"] == [] and result["problems"] == [], result
    assert result["verify_runs"] >= 3 and result["verify_runs_invalid"] == 0, result
    assert result["final_valid"] is True
    assert result["final_entries"] == 5 + 120  # the facts (totals, allocations, grant) and one per release
    assert result["exported_heads"] == 1 + 1 + 120  # a head per commit that moved the chain: creation, grant, each
