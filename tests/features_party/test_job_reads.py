"""A job reads what it trains on, within the process's budget for table reads (issue 40's eleventh review: a
124-byte job on a features table of 120,000 columns read them all, +1,169 MB and 10 s of CPU, then answered 400;
four at once took the trainer to 19.7 GB, killed by the kernel)."""

from __future__ import annotations

import threading
import tracemalloc

import numpy as np
import pandas as pd
import pytest

from features_party.features import table_bytes
from shared.errors import ErrorCode, RetryLater
from shared.service.budgets import ByteBudget
from tests.features_party.test_api import trainer_client, trainer_context

UNREACHABLE = "http://127.0.0.1:9"  # nothing listens: a job that got as far as the labels party would say so
ROWS, COLUMNS = 3000, 1500  # 36 MB of float64 when read whole


def _wide(tmp_path, **settings):
    ctx = trainer_context(tmp_path, UNREACHABLE, start=False, **settings)
    trainer = trainer_client(ctx, "publisher")
    rng = np.random.default_rng(0)
    frame = pd.DataFrame(rng.normal(size=(ROWS, COLUMNS)), columns=[f"c{i}" for i in range(COLUMNS)])
    frame.insert(0, "example_id", [f"u{i}" for i in range(ROWS)])
    answer = trainer.put("/v1/features/wide", content=frame.to_csv(index=False), headers={"Content-Type": "text/csv"})
    assert answer.status_code == 200, answer.text
    return ctx, trainer


def _job(**columns):
    return {"features": "wide", "api_key": "ldp_unused", "dataset_id": "d", "labels_party": "office",
            "release": {"mechanism": "opt-unbiased", "epsilon": 1.0}, "numeric": ["c0", "c1"], "categorical": [],
            **columns}


def test_a_job_reads_its_own_columns_only(tmp_path):
    ctx, trainer = _wide(tmp_path)
    try:
        tracemalloc.start()
        try:
            missing = trainer.post("/v1/jobs", json=_job(numeric=["c0", "nope"]))
            read = trainer.post("/v1/jobs", json=_job())
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert missing.status_code == 400 and missing.json()["error"]["code"] == "malformed_file", missing.text
        assert "nope" in missing.json()["error"]["message"]
        # planned, then refused where it asks the labels party (not reachable): the read happened, two columns of it
        assert read.status_code == 502 and read.json()["error"]["code"] == "labels_party_unreachable", read.text
        assert peak < 12 << 20, peak  # the whole table is 36 MB of numbers
    finally:
        ctx.close()


def test_a_table_read_over_the_budget_is_refused_before_it_is_read(tmp_path):
    ctx, trainer = _wide(tmp_path, table_read_budget_bytes=64 << 10)
    try:
        stored = next((tmp_path / "trainer").rglob("wide.parquet"))
        assert table_bytes(str(stored), ["c0", "c1"]) > 64 << 10  # ids and two columns of 3,000 rows
        answer = trainer.post("/v1/jobs", json=_job())
        assert answer.status_code == 400 and answer.json()["error"]["code"] == "job_too_large", answer.text
        assert trainer.get("/v1/jobs").json() == []  # nothing kept
    finally:
        ctx.close()


def test_reads_at_once_share_the_budget_and_wait_their_turn():
    budget = ByteBudget(100, 100, wait_seconds=0.3)
    entered, release = threading.Event(), threading.Event()

    def first():
        with budget.held(80, "one read", ErrorCode.JOB_TOO_LARGE):
            entered.set()
            release.wait(5)

    worker = threading.Thread(target=first)
    worker.start()
    assert entered.wait(5)
    with pytest.raises(RetryLater) as busy:  # 80 of 100 held: 30 more are not free within the wait
        with budget.held(30, "another read", ErrorCode.JOB_TOO_LARGE):
            pass
    assert busy.value.code == "server_busy" and busy.value.retry_after >= 1
    release.set()
    worker.join(5)
    with budget.held(30, "another read", ErrorCode.JOB_TOO_LARGE):
        assert budget.used == 30
    assert budget.used == 0


_PLAN_READ = """
import json, sys
from features_party.features import Preprocessor, table_bytes
from features_party.planning import load_frame
def kb(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
file, columns = sys.argv[1], sys.argv[2].split(",")
load_frame(file, columns[:1])  # the libraries' own first use, not the read's
base = kb("VmRSS")
open("/proc/self/clear_refs", "w").write("5")
frame = load_frame(file, columns)
Preprocessor.check(frame, columns, [])
print(json.dumps({"growth": (kb("VmHWM") - base) << 10, "estimate": table_bytes(file, columns)}))
"""


def test_the_estimate_of_a_read_bounds_it_when_repeated_values_make_tiny_pages(tmp_path):
    """The twelfth review: the trainer stores a column of one repeated value as a dictionary of tiny pages; counted
    by its pages, 20,000 rows × 1,000 columns were 2.2 MB, and planning took +886 MB (Arrow's values, pandas', and
    the check's copy of the whole matrix). The estimate counts every value's width; the check copies one column."""
    import json
    import subprocess
    import sys
    from pathlib import Path
    ctx = trainer_context(tmp_path, UNREACHABLE, start=False)
    trainer = trainer_client(ctx, "publisher")
    rows, columns = 4000, 800
    body = "example_id," + ",".join(f"c{i}" for i in range(columns)) + "\n" + \
        "".join(f"u{r}" + ",0" * columns + "\n" for r in range(rows))
    assert trainer.put("/v1/features/zeros", content=body, headers={"Content-Type": "text/csv"}).status_code == 200
    ctx.close()
    stored = str(next((tmp_path / "trainer").rglob("zeros.parquet")))
    names = ",".join(f"c{i}" for i in range(columns))
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", _PLAN_READ, stored, names], capture_output=True, text=True,
                          cwd=root, check=True)
    measured = json.loads(done.stdout)
    assert measured["estimate"] >= rows * columns * 8  # at least the values' own width
    assert measured["growth"] <= measured["estimate"], measured


def test_the_estimate_counts_a_long_string_named_by_every_row(tmp_path):
    """The review of the twelfth round's fixes: a column of one 200 KB string named by 1,500 rows is a dictionary
    page of 200 KB, and read as strings it is 300 MB (+495 MB for a 147-byte job). Each dictionary-encoded value
    counts the longest entry of its dictionary page."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    file = tmp_path / "t.parquet"
    rows, long = 1_500, "s" * 200_000
    pq.write_table(pa.table({"example_id": [f"u{i}" for i in range(rows)], "s": [long] * rows}), file)
    assert table_bytes(file, ["s"]) >= 2 * rows * len(long)
    assert table_bytes(file, []) < 1 << 20  # the ids alone


def test_a_category_of_one_long_value_among_short_ones_is_counted_as_its_rows_hold(tmp_path):
    """The fourteenth review: counting every dictionary-encoded row at the longest entry put 40,000 rows of "a"
    and one 500 KB value at 40 GB, and an honest job was refused. A wholly dictionary-encoded chunk is counted
    row by row (its indices read, not its strings)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    file = tmp_path / "t.parquet"
    rows = 40_000
    pq.write_table(pa.table({"example_id": [f"u{i}" for i in range(rows)],
                             "c": ["a"] * (rows - 1) + ["z" * 500_000]}), file)
    assert 2 * (rows - 1 + 500_000) <= table_bytes(file, ["c"]) - table_bytes(file, []) < 8 << 20
