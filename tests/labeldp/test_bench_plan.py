"""`labeldp bench utility --dry-run`: the plan without training — its numbers (rows, jobs, columns), the warnings
on a column that leaks the label and on a categorical with many levels, ``--rows`` — and the same warnings on
stderr in a run, and `--help` with every default and mechanism name."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from labeldp.benchmarks import choices
from labeldp.cli import main

ROWS = 600


def flights(n: int = ROWS, seed: int = 0) -> pd.DataFrame:
    """A delay label; `arrival` is the label plus a minute of noise (observed after it: a leak); `tail` is one of
    200 aircraft codes (many levels, few rows each, but not distinct on every row, so not id-like); `distance` and
    `carrier` are honest features; `flight_id` is an id the bench leaves out."""
    rng = np.random.default_rng(seed)
    distance = rng.uniform(200, 2000, n)
    carrier = rng.choice(["AA", "UA", "DL"], n)
    delay = np.round(0.01 * distance + np.where(carrier == "UA", 10.0, 0.0) + rng.normal(0, 15, n))
    return pd.DataFrame({"flight_id": np.arange(n), "distance": distance, "carrier": carrier,
                         "tail": [f"N{k:03d}" for k in rng.integers(0, 200, n)],
                         "arrival": 600 + delay + rng.normal(0, 1, n), "delay": delay})


@pytest.fixture()
def table(tmp_path: Path) -> Path:
    path = tmp_path / "flights.csv"
    flights().to_csv(path, index=False)
    return path


def _plan(capsys, *args) -> dict:
    code = main(["bench", "utility", "--dry-run", "--json", *map(str, args)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out)


def test_the_dry_run_plan_names_the_leak_and_the_many_levels(capsys, table, tmp_path):
    plan = _plan(capsys, "--data", table, "--label", "delay", "--clip", "-60:180", "--seeds", 3,
                 "--epsilons", "0.5,1,2,4", "--mechanisms", "non-private,laplace,opt-unbiased",
                 "--out", tmp_path / "out")
    assert (plan["seeds"], plan["epsilons"], plan["rows"]) == (3, [0.5, 1.0, 2.0, 4.0], None)
    assert plan["jobs"] == 3 * 4 * 2 and plan["non_private_models"] == 3
    [dataset] = plan["datasets"]
    assert dataset["rows"] == ROWS and dataset["dropped_rows"] == 0
    assert (dataset["label"], dataset["label_kind"], dataset["clip"]) == ("delay", "integer",
                                                                        {"low": -60, "high": 180})
    assert dataset["mechanisms"] == ["non-private", "laplace", "opt-unbiased"]
    features = {f["name"]: f for f in dataset["features"]}
    assert set(features) == {"distance", "arrival", "carrier", "tail"}
    assert features["carrier"] == {"name": "carrier", "type": "categorical", "levels": 3}
    assert features["tail"]["levels"] == flights()["tail"].nunique()
    assert features["distance"] == {"name": "distance", "type": "numeric", "distinct": ROWS}
    assert dataset["left_out"] == {"flight_id": "id-like name"}
    warned = {w["column"]: w for w in dataset["warnings"]}
    assert set(warned) == {"arrival", "tail"}  # distance (|r| about 0.5) and carrier (3 levels) are fine
    assert warned["arrival"]["warning"] == "suspected_leak" and warned["arrival"]["value"] > 0.99
    assert warned["tail"]["warning"] == "high_cardinality" and warned["tail"]["value"] > 0.05 * ROWS
    assert not (tmp_path / "out").exists()  # nothing ran


def test_rows_subsamples_and_the_default_mechanisms_count(capsys, table):
    plan = _plan(capsys, "--data", table, "--label", "delay", "--rows", 250, "--seeds", 2, "--epsilons", "1,8")
    [dataset] = plan["datasets"]
    assert plan["rows"] == 250 and dataset["rows"] == 250
    private = [m for m, fields in choices.MECHANISMS.items() if fields is not None]
    assert dataset["mechanisms"] == list(choices.MECHANISMS)
    assert plan["jobs"] == dataset["jobs"] == 2 * 2 * len(private) == 40  # auto and rp-with-prior among them
    # the draw is seeded: the same rows, so the same distinct distances, on every run
    again = _plan(capsys, "--data", table, "--label", "delay", "--rows", 250, "--seeds", 2, "--epsilons", "1,8")
    assert again["datasets"][0]["features"] == dataset["features"]


def test_too_few_rows_and_json_without_dry_run_are_one_line_errors(capsys, table):
    assert main(["bench", "utility", "--data", str(table), "--label", "delay", "--rows", "30", "--dry-run"]) == 2
    assert main(["bench", "utility", "--data", str(table), "--label", "delay", "--json"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "--rows 30" in err[0] and "--json applies to --dry-run" in err[1]


def test_the_text_plan(capsys, table):
    assert main(["bench", "utility", "--dry-run", "--data", str(table), "--label", "delay", "--seeds", "1",
                 "--epsilons", "1", "--mechanisms", "laplace"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Plan: 1 trainer jobs and 1 non-private models")  # the reference: every seed
    assert "jobs: 1 seeds × 1 ε × 1 private mechanisms = 1" in out
    assert "tail: categorical" in out and "flight_id: id-like name" in out
    assert "numeric column 'arrival' has |correlation| 0.99" in out


def test_a_run_prints_the_warnings_on_stderr(capsys, table, tmp_path):
    """The same warnings as the plan's, on stderr, before the (smallest) run trains."""
    code = main(["bench", "utility", "--data", str(table), "--label", "delay", "--rows", "300", "--seeds", "1",
                 "--mechanisms", "non-private", "--epochs", "2", "--out", str(tmp_path / "out")])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    warnings = [line for line in captured.err.splitlines() if line.startswith("labeldp: warning: flights:")]
    assert len(warnings) == 2 and "'tail'" in warnings[0] and "'arrival'" in warnings[1]
    assert (tmp_path / "out" / "runs.csv").exists()


def test_help_shows_the_defaults_mechanisms_and_jobs(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "utility", "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    grid = choices.DEFAULT
    assert f"(default: {','.join(f'{e:g}' for e in grid.epsilons)})" in text
    assert f"default: {grid.seeds})" in text and f"(default: {grid.epochs})" in text
    for name in [*choices.MECHANISMS, *choices.CLASSIFICATION_MECHANISMS]:
        assert name in text
    # every bundled dataset, as the benchmark defines them
    from labeldp.benchmarks.utility import DATASETS

    assert choices.DATASET_NAMES == tuple(DATASETS) and f"{', '.join(DATASETS)}, a comma list" in text
    assert f"{grid.seeds} × {len(grid.epsilons)} × 10 = {grid.seeds * len(grid.epsilons) * 10} jobs" in text  # auto too


def test_auto_candidates_are_checked_before_anything_starts(capsys, table):
    """--auto-candidates: only with auto among the mechanisms, only names an auto job takes, and only mechanisms
    the labels fit (BlockRR is for classes: refused by the preflight, before a service starts)."""
    base = ["bench", "utility", "--dry-run", "--data", str(table), "--label", "delay", "--seeds", "1",
            "--epsilons", "1"]
    assert main([*base, "--auto-candidates", "rp-with-prior"]) == 2
    assert main([*base, "--mechanisms", "auto", "--auto-candidates", "opt-unbiased,laplace"]) == 2
    assert main([*base, "--mechanisms", "auto", "--auto-candidates", "opt-unbiased,block-rr"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and "add auto to --mechanisms" in err[0]
    assert "unknown --auto-candidates laplace" in err[1] and "rp-with-prior" in err[1]
    assert "block-rr" in err[2]
    assert main([*base, "--mechanisms", "auto", "--auto-candidates", "opt-unbiased,rp-with-prior"]) == 0


def test_labeldp_pro_methods_are_checked_before_anything_starts(capsys):
    assert main(["bench", "labeldp-pro", "--methods", "rr,alibi", "--seeds", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown --methods alibi" in err[0] and "pate-fm" in err[0]
