"""`labeldp bench utility --data FILE --label COL`: a researcher's own table through the bench's protocol — the
tables the tests write themselves (a known linear relation + noise), the columns and kind it infers, the declared
clipping counted by the labels service, and one stderr line with exit code 2 for every bad table or option."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from labeldp.benchmarks.private_clip import AutoClip, clip_from_quantiles
from labeldp.benchmarks.tables import TableSource, infer_columns, infer_kind, parse_clip
from labeldp.benchmarks.utility import RAW, TRUTH
from labeldp.cli import main

LOW, HIGH = 15, 85  # the declared clip of the integer table


def linear_table(n: int = 400, seed: int = 0, *, integer: bool = True) -> pd.DataFrame:
    """y = 50 + 15·x1 − 8·x2 + 6·[c = a] + N(0, 2²): the features explain nearly all of the label's variance
    (~300), so a model beats the mean by far; an id column the bench must not use."""
    rng = np.random.default_rng(seed)
    x1, x2 = rng.normal(size=n), rng.normal(size=n)
    c = rng.choice(["a", "b", "c"], size=n)
    y = 50 + 15 * x1 - 8 * x2 + np.where(c == "a", 6.0, 0.0) + rng.normal(scale=2.0, size=n)
    return pd.DataFrame({"id": np.arange(n), "x1": x1, "x2": x2, "c": c, "y": np.round(y) if integer else y})


def _cli(capsys, *args) -> tuple[int, str, list[str]]:
    code = main(["bench", "utility", *map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err.strip().splitlines()


# -- end to end: runs.csv, summary.md, datasets.json and the PNG ----------------------------------------------------

def _check_runs(out: Path, mechanisms: list[str], epsilons: list[float], seeds: int) -> pd.DataFrame:
    runs = pd.read_csv(out / "runs.csv")
    expected = {("non-private", None, s) for s in range(seeds)} | {
        (m, e, s) for m in mechanisms for e in epsilons for s in range(seeds)}
    got = {(m, None if math.isnan(e) else e, s) for m, e, s in zip(runs.mechanism, runs.epsilon, runs.seed,
                                                                   strict=True)}
    assert got == expected and len(runs) == len(expected)
    return runs


@pytest.mark.slow
def test_own_csv_with_declared_clip(tmp_path, capsys):
    """Integer labels (inferred), clipped by the labels service to [15, 85]: the counts it reports are the ones
    planted; the non-private model beats the training mean by far; every private run is finite."""
    table = linear_table()
    below, above = int((table.y < LOW).sum()), int((table.y > HIGH).sum())
    assert below >= 3 and above >= 3  # the table plants labels on both sides of the clip
    table.to_csv(tmp_path / "linear.csv", index=False)
    out = tmp_path / "out"
    code, stdout, err = _cli(capsys, "--data", tmp_path / "linear.csv", "--label", "y", "--clip", f"{LOW}:{HIGH}",
                             "--seeds", 1, "--epsilons", "1,4", "--mechanisms", "non-private,laplace,opt-unbiased",
                             "--epochs", 30, "--out", out)
    assert code == 0, err
    runs = _check_runs(out, ["laplace", "opt-unbiased"], [1.0, 4.0], 1)
    assert np.isfinite(runs["test_loss"]).all()
    reference = runs[runs.mechanism == "non-private"].iloc[0]
    assert reference.test_loss < 0.2 * reference.constant_test_loss, reference  # the relation is learned
    private = runs[runs.mechanism != "non-private"]
    assert (private["certified_epsilon"] <= private["epsilon"]).all()
    assert (private["noisy_label_loss"] > 0).all()
    [dataset] = json.loads((out / "datasets.json").read_text())
    assert (dataset["clipped_below"], dataset["clipped_above"]) == (below, above)
    assert dataset["kind"] == "integer" and dataset["domain"] == {"label_kind": "integer",
                                                                  "clip": {"low": LOW, "high": HIGH}}
    assert dataset["numeric"] == ["x1", "x2"] and dataset["categorical"] == ["c"]
    assert dataset["ignored_columns"] == {"id": "id-like name"}
    summary = (out / "summary.md").read_text()
    assert f"clipped {below} labels up and {above} down at upload" in summary
    assert "| opt-unbiased |" in summary and "# Privacy–utility benchmark" in stdout
    assert (out / "linear.png").read_bytes()[:4] == b"\x89PNG"


def test_own_parquet_continuous_on_a_grid(tmp_path, capsys):
    """Continuous labels (inferred) without a clip: the labels' own bounds, said to be data-dependent; --grid."""
    linear_table(seed=1, integer=False).to_parquet(tmp_path / "linear.parquet")
    out = tmp_path / "out"
    code, _, err = _cli(capsys, "--data", tmp_path / "linear.parquet", "--label", "y", "--grid", 21, "--seeds", 1,
                        "--epsilons", 2, "--mechanisms", "non-private,rr-on-bins", "--epochs", 30, "--out", out)
    assert code == 0, err
    runs = _check_runs(out, ["rr-on-bins"], [2.0], 1)
    assert np.isfinite(runs["test_loss"]).all()
    reference = runs[runs.mechanism == "non-private"].iloc[0]
    assert reference.test_loss < 0.2 * reference.constant_test_loss
    [dataset] = json.loads((out / "datasets.json").read_text())
    assert dataset["kind"] == "continuous" and dataset["domain"]["grid_size"] == 21
    assert (dataset["clipped_below"], dataset["clipped_above"]) == (0, 0)
    assert "a data-dependent choice, fine for a benchmark, not for a release" in (out / "summary.md").read_text()


def test_own_table_with_a_private_clip(tmp_path, capsys):
    """--clip auto: the owner's DP quantiles on an outer dataset of the same labels give the clip the releases are
    made under; their ε is charged there and added to each example's budget in the summary."""
    table = linear_table(seed=1, integer=False)
    table.to_csv(tmp_path / "linear.csv", index=False)
    out = tmp_path / "out"
    code, _, err = _cli(capsys, "--data", tmp_path / "linear.csv", "--label", "y", "--clip", "auto:0.05:0.95:1:0:100",
                        "--grid", 21, "--seeds", 1, "--epsilons", 2, "--mechanisms", "non-private,laplace",
                        "--epochs", 10, "--out", out)
    assert code == 0, err
    [dataset] = json.loads((out / "datasets.json").read_text())
    chosen = dataset["private_clip"]
    low, high = chosen["clip"]
    assert chosen["values"] == [low, high] and chosen["epsilon_spent"] == 1.0
    for q, value in zip((0.05, 0.95), (low, high), strict=True):  # grid step 5, ~20 labels a step, ε = 1/2 each
        assert value % 5 == 0 and abs(value - np.quantile(table.y, q)) <= 10
    assert dataset["domain"] == {"label_kind": "continuous", "clip": {"low": low, "high": high}, "grid_size": 21}
    assert (dataset["clipped_below"], dataset["clipped_above"]) == (int((table.y < low).sum()),
                                                                    int((table.y > high).sum()))
    assert dataset["epsilon_per_example"] == {"releases": 2.0, "clip": 1.0, "total": 3.0}
    summary = (out / "summary.md").read_text()
    assert "each example's budget is 1 (clip) + 2 (releases) = 3" in summary
    assert f"Clip [{low:g}, {high:g}] chosen privately" in summary
    runs = _check_runs(out, ["laplace"], [2.0], 1)
    assert np.isfinite(runs["test_loss"]).all()


def test_a_private_clip_is_planned_on_its_outer_range(tmp_path, capsys):
    linear_table().to_csv(tmp_path / "linear.csv", index=False)
    code, stdout, err = _cli(capsys, "--data", tmp_path / "linear.csv", "--label", "y", "--clip", "auto:0.01:0.99:0.2",
                             "--seeds", 1, "--epsilons", 1, "--mechanisms", "laplace", "--dry-run", "--json")
    assert code == 0, err
    [planned] = json.loads(stdout)["datasets"]
    table = linear_table()
    assert planned["clip"] == {"low": int(table.y.min()), "high": int(table.y.max())}  # the labels' own: no outer
    assert planned["private_clip"] == {"quantiles": [0.01, 0.99], "epsilon": 0.2, "outer": None}


@pytest.mark.slow
def test_own_table_of_classes(tmp_path, capsys):
    """String labels with --kind classes: the classification protocols, scored by accuracy."""
    table = linear_table(seed=2, integer=False)
    table["y"] = np.where(table.y > 60, "high", np.where(table.y < 40, "low", "mid"))
    table.to_csv(tmp_path / "classes.csv", index=False)
    out = tmp_path / "out"
    code, _, err = _cli(capsys, "--data", tmp_path / "classes.csv", "--label", "y", "--kind", "classes",
                        "--seeds", 1, "--epsilons", 4, "--mechanisms", "non-private,rr,rr-with-prior",
                        "--epochs", 30, "--out", out)
    assert code == 0, err
    runs = _check_runs(out, ["rr", "rr-with-prior"], [4.0], 1)
    reference = runs[runs.mechanism == "non-private"].iloc[0]
    assert reference.accuracy > reference.constant_test_loss + 0.2  # beats the majority class
    assert 0 < runs[runs.mechanism == "rr"].iloc[0].accuracy <= 1
    # RRWithPrior on the labels party's noisy global prior: ε₁ = √(k/n) of the 4, the whole ε certified
    with_prior = runs[runs.mechanism == "rr-with-prior"].iloc[0]
    trained = round(len(table) * 0.8 * 0.9)  # the training split, less the job's estimate rows (10 %)
    assert with_prior.prior_epsilon == pytest.approx((3 / trained) ** 0.5, rel=0.02)
    assert with_prior.certified_epsilon == pytest.approx(4.0, abs=1e-6)
    assert with_prior.accuracy > reference.constant_test_loss
    assert "Test accuracy" in (out / "summary.md").read_text()


# -- what is inferred ------------------------------------------------------------------------------------------------

def test_columns_inferred_and_id_like_ones_left_out():
    n = 60
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({
        "rownames": np.arange(1, n + 1), "user_id": rng.integers(0, 5, n), "row": rng.permutation(n),
        "code": [f"c{i}" for i in range(n)], "x": rng.normal(size=n), "count": rng.integers(0, 9, n),
        "flag": rng.random(n) > 0.5, "group": rng.choice(["a", "b"], n),
        "level": pd.Categorical(rng.choice(["lo", "hi"], n)), "when": pd.date_range("2020-01-01", periods=n),
        "label": rng.normal(size=n)})
    numeric, categorical, ignored = infer_columns(frame, "label")
    assert numeric == ("x", "count")
    assert categorical == ("flag", "group", "level")
    assert ignored.pop("when").endswith("is neither a number nor a category")  # datetime64[ns] or [us]
    assert ignored == {"rownames": "id-like name", "user_id": "id-like name",
                       "row": "id-like: integers numbering the rows", "code": "id-like: a distinct string on every row"}


def test_kind_and_loss_inferred(tmp_path):
    linear_table(integer=True).to_csv(tmp_path / "a.csv", index=False)
    linear_table(integer=False).to_csv(tmp_path / "b.csv", index=False)
    integer = TableSource(tmp_path / "a.csv", "y").prepare()
    continuous = TableSource(tmp_path / "b.csv", "y").prepare()
    assert (integer.info["kind"], integer.loss, integer.domain["label_kind"]) == ("integer", "squared", "integer")
    assert (continuous.info["kind"], continuous.loss, continuous.domain["grid_size"]) == ("continuous", "squared", 101)
    assert infer_kind(np.array([1.0, 2.0, 3.0])) == "integer" and infer_kind(np.array([1.0, 2.5])) == "continuous"
    # no --clip: the labels' own min and max, and the summary says it is data-dependent
    labels = integer.frame[RAW]
    assert integer.domain["clip"] == {"low": int(labels.min()), "high": int(labels.max())}
    assert any("data-dependent" in note for note in integer.notes)
    # --clip: raw labels kept for the upload, the scored ones clipped the same way
    clipped = TableSource(tmp_path / "a.csv", "y", clip=(LOW, HIGH), grid=11).prepare()
    assert clipped.domain == {"label_kind": "integer", "clip": {"low": LOW, "high": HIGH}, "grid_size": 11}
    assert clipped.frame[RAW].min() < LOW and clipped.frame[TRUTH].min() == LOW
    assert clipped.frame[TRUTH].max() == HIGH
    classes = TableSource(tmp_path / "a.csv", "y", kind="finite", loss="cross_entropy").prepare()
    assert classes.classification and classes.loss == "cross_entropy"
    assert set(classes.frame[TRUTH]) == set(range(classes.num_classes))
    poisson = TableSource(tmp_path / "a.csv", "y", clip=(0, 100), loss="poisson").prepare()
    assert poisson.metric == "relative_test_loss"


def test_parse_clip():
    assert parse_clip("0:15000") == (0.0, 15000.0) and parse_clip("-5:5") == (-5.0, 5.0)
    assert parse_clip("auto:0.01:0.99:0.1") == AutoClip(0.01, 0.99, 0.1)
    assert parse_clip("auto:0.01:0.99:0.1:-60:180") == AutoClip(0.01, 0.99, 0.1, (-60.0, 180.0))


def test_quantiles_that_cross_or_meet_still_give_a_clip():
    grid = np.arange(0.0, 11.0)
    assert clip_from_quantiles((7.0, 3.0), grid) == (3.0, 7.0)
    assert clip_from_quantiles((4.0, 4.0), grid) == (4.0, 5.0) and clip_from_quantiles((10.0, 10.0), grid) == (9.0,
                                                                                                           10.0)


# -- one stderr line and exit code 2 for every bad table or option ---------------------------------------------------

@pytest.fixture()
def tables(tmp_path) -> Path:
    linear_table().to_csv(tmp_path / "ok.csv", index=False)
    linear_table(n=40).to_csv(tmp_path / "small.csv", index=False)
    (tmp_path / "header.csv").write_text("x1,x2,y\n")
    (tmp_path / "blank.csv").write_text("")
    (tmp_path / "book.xlsx").write_bytes(b"PK\x03\x04not really")
    (tmp_path / "broken.parquet").write_bytes(b"this is not parquet")
    text = linear_table()
    text["y"] = np.where(text.y > 50, "many", text.y.astype(str))
    text.to_csv(tmp_path / "text.csv", index=False)
    wide = linear_table()
    wide["y"] = np.arange(len(wide)) * 10
    wide.to_csv(tmp_path / "wide.csv", index=False)
    return tmp_path


BAD = {
    "missing file": (["--data", "{d}/nope.csv", "--label", "y"], "no such file"),
    "unknown format": (["--data", "{d}/book.xlsx", "--label", "y"], "unknown format '.xlsx'"),
    "unreadable parquet": (["--data", "{d}/broken.parquet", "--label", "y"], "cannot read it as Parquet"),
    "empty file": (["--data", "{d}/blank.csv", "--label", "y"], "the table is empty"),
    "no rows": (["--data", "{d}/header.csv", "--label", "y"], "no rows"),
    "missing label column": (["--data", "{d}/ok.csv", "--label", "price"], "no label column 'price'"),
    "missing features": (["--data", "{d}/ok.csv", "--label", "y", "--features", "x1,size,weight"],
                         "no feature column(s) 'size', 'weight'"),
    "non-numeric labels": (["--data", "{d}/text.csv", "--label", "y"], "is not numeric (e.g. 'many')"),
    "clip low >= high": (["--data", "{d}/ok.csv", "--label", "y", "--clip", "9:9"], "LOW must be below HIGH"),
    "malformed clip": (["--data", "{d}/ok.csv", "--label", "y", "--clip", "0-100"], "--clip takes LOW:HIGH"),
    "auto clip without ε": (["--data", "{d}/ok.csv", "--label", "y", "--clip", "auto:0.1:0.9"],
                            "--clip auto:Q_LOW:Q_HIGH:EPS[:LOW:HIGH]"),
    "auto clip quantiles crossed": (["--data", "{d}/ok.csv", "--label", "y", "--clip", "auto:0.9:0.1:1"],
                                    "0 < Q_LOW < Q_HIGH < 1"),
    "auto clip outer crossed": (["--data", "{d}/ok.csv", "--label", "y", "--clip", "auto:0.1:0.9:1:5:-5"],
                                "LOW must be below HIGH"),
    "too few rows": (["--data", "{d}/small.csv", "--label", "y"], "32 training and 8 test rows"),
    "test fraction 0": (["--data", "{d}/ok.csv", "--label", "y", "--test-fraction", "0"], "between 0 and 1"),
    "test fraction 1.5": (["--data", "{d}/ok.csv", "--label", "y", "--test-fraction", "1.5"], "between 0 and 1"),
    "data and dataset": (["--data", "{d}/ok.csv", "--label", "y", "--dataset", "psid-weeks"],
                         "--data FILE or --dataset NAME, not both"),
    "no label": (["--data", "{d}/ok.csv"], "--data needs --label"),
    "table option alone": (["--label", "y"], "add --data FILE"),
    "range too wide": (["--data", "{d}/wide.csv", "--label", "y", "--mechanisms", "non-private,opt-unbiased"],
                       "add --grid N"),
    "regression mechanism on classes": (["--data", "{d}/ok.csv", "--label", "c", "--kind", "classes",
                                         "--mechanisms", "laplace"], "do not fit"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_table_or_option_is_one_line(tables, capsys, case):
    args, expected = BAD[case]
    code, _, err = _cli(capsys, *[a.format(d=tables) for a in args], "--out", tables / "out")
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("labeldp: error:") and expected in err[0], err[0]
    assert not (tables / "out").exists()  # refused before anything ran
