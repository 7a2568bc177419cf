"""verify-audit in a loop during releases on a live service is clean (issue 28, item 9: on PostgreSQL it crashed
16/16 times, superseded budget files gone under it). 120 releases on PostgreSQL (~12 s on this 2-core machine);
20 on SQLite (~20 s), where every transaction — verify-audit's too — holds the database's write lock, so a verify
loop starves the charges (a deployment that audits under load runs PostgreSQL). bench/audit_under_load.py runs
the issue's 1000."""

from __future__ import annotations

from tests.support.audit_load import run


def test_verify_audit_in_a_loop_during_releases_is_clean(database_url, tmp_path):
    releases = 20 if database_url.startswith("sqlite") else 120
    result = run(database_url, tmp_path, releases=releases)
    assert result["errors"] == [] and result["problems"] == [], result
    assert result["verify_runs"] >= 2 and result["verify_runs_invalid"] == 0, result
    assert result["final_valid"] is True
    # the facts (totals, owner, domain, the owner's allocation and key, the labels, the grantee's key, two allocations,
    # the grant), then per release its charge and its availability
    assert result["final_entries"] == 10 + 2 * releases
    # a head per commit that moved the chain: creation, upload, grant, and per release its charge and availability
    assert result["exported_heads"] == 3 + 2 * releases
