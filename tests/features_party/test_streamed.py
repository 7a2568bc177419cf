"""Training from disk (issue 43): DuckDB's join of a features table in several Parquet files with a release's labels
splits rows by their ids (whatever the files), leaves held-out rows out, and fits the preprocessing on the training
rows exactly as the in-memory Preprocessor does; the streamed MLP and XGBoost's external-memory trees learn what
the in-memory learners learn on the same rows; predictions cover every row of the table, marked held out or not.
About 40 s."""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from features_party import joined
from features_party.features import Preprocessor
from features_party.learn.gbdt import GbdtConfig, train_gbdt
from features_party.learn.streamed import fit_gbdt, fit_mlp
from features_party.learn.train import TrainConfig, train
from features_party.parts import estimate_mask
from shared.splits import holdout_mask
from tests.features_party.test_api import _finish, _spent

N, NUMERIC = 40_000, [f"x{j}" for j in range(4)]


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    """A features table in four files (a categorical column among them), labels for half its rows — y = 2·x0 + 1
    for level "a" + N(0, 1) noise — and 500 held-out ids."""
    root = tmp_path_factory.mktemp("streamed")
    rng = np.random.default_rng(7)
    ids = np.array([f"e{i}" for i in range(N)])
    x = rng.normal(size=(N, len(NUMERIC))).astype(np.float32)
    level = rng.choice(["a", "b", "c"], N)
    y = 2 * x[:, 0] + (level == "a") + rng.normal(size=N)
    frame = pd.DataFrame({"example_id": ids, **{c: x[:, j] for j, c in enumerate(NUMERIC)}, "c": level})
    (root / "features").mkdir()
    for k, part in enumerate(np.array_split(np.arange(N), 4)):
        pq.write_table(pa.Table.from_pandas(frame.iloc[part], preserve_index=False),
                       root / "features" / f"part-{k}.parquet")
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), root / "one.parquet")
    pq.write_table(pa.table({"example_id": ids[::2], "label": y[::2]}), root / "labels.parquet")
    pq.write_table(pa.table({"example_id": ids[:1000]}), root / "held.parquet")
    return root, frame.set_index("example_id"), pd.Series(y, index=ids)


def _join(root, features, workdir, **options):
    return joined.join(root / features, root / "labels.parquet", root / workdir, numeric=NUMERIC,
                       categorical=["c"], seed=3, validation_fraction=0.2, held_out=root / "held.parquet", **options)


def test_the_join_splits_by_id_leaves_held_out_rows_out_and_fits_as_in_memory(table):
    root, frame, y = table
    parts, whole = _join(root, "features", "w1"), _join(root, "one.parquet", "w2")
    fit = pq.read_table(parts.fit.path).to_pandas()
    validation = pq.read_table(parts.validation.path).to_pandas()
    assert len(fit) + len(validation) == N // 2 - 500 and parts.matched == N // 2  # 500 labelled ids held out
    assert 0.18 < len(validation) / (len(fit) + len(validation)) < 0.22
    # the same rows, whatever the files: the split is a hash of each id
    by_id = lambda frame: frame.sort_values("example_id").reset_index(drop=True)  # noqa: E731
    assert by_id(pq.read_table(whole.fit.path).to_pandas()).equals(by_id(fit))
    labelled = y.iloc[::2].drop(y.index[:1000], errors="ignore")
    assert sorted(fit["label"].tolist() + validation["label"].tolist()) == sorted(labelled.tolist())
    assert parts.fit.groups == 1
    # the preprocessing of the training rows, as the in-memory Preprocessor fits it on them
    assert set(fit["example_id"]).isdisjoint(validation["example_id"])
    assert set(fit["example_id"]) | set(validation["example_id"]) == set(labelled.index)
    expected = Preprocessor.fit(frame.loc[fit["example_id"]], NUMERIC, ["c"])
    assert np.allclose(parts.fit.preprocessor.means, expected.means, rtol=0, atol=1e-6)
    assert np.allclose(parts.fit.preprocessor.stds, expected.stds, rtol=1e-6)
    assert parts.fit.preprocessor.vocabularies == expected.vocabularies == (("a", "b", "c"),)
    assert parts.scaling.shift == pytest.approx(fit["label"].mean()) and \
        parts.scaling.scale == pytest.approx(fit["label"].std(ddof=0))


def test_the_streamed_learners_learn_what_the_in_memory_ones_do(table):
    """Noise variance 1: the squared loss (half the MSE) of the best model is about 0.5, a constant's about 2.7."""
    root, _frame, _y = table
    rows = _join(root, "features", "w3")
    fit = pq.read_table(rows.fit.path).to_pandas()
    constant = 0.5 * float(pq.read_table(rows.validation.path).to_pandas()["label"].var(ddof=0))
    mlp = fit_mlp(TrainConfig(epochs=6, batch_size=256, patience=3), rows.fit, rows.validation, scaling=rows.scaling)
    numeric, categorical = rows.fit.preprocessor.transform(fit)
    in_memory = train(TrainConfig(epochs=6, batch_size=256, patience=3), numeric, categorical,
                      fit["label"].to_numpy(), vocab_sizes=rows.fit.preprocessor.vocab_sizes)
    best = min(h["val_loss"] for h in mlp.history)
    assert constant > 2.0 and best < 0.56, (constant, best)
    assert abs(best - min(h["val_loss"] for h in in_memory.history)) < 0.05
    pages: list[int] = []  # the page files on disk, seen after each round
    trees = fit_gbdt(GbdtConfig(n_estimators=60, learning_rate=0.2), rows.fit, rows.validation, root / "w3" / "xgb",
                     on_epoch=lambda _: pages.append(len(list((root / "w3" / "xgb").rglob("*.page")))))
    in_memory_trees = train_gbdt(GbdtConfig(n_estimators=60, learning_rate=0.2), numeric, categorical,
                                 fit["label"].to_numpy())
    best_trees = min(h["val_loss"] for h in trees.history)
    assert best_trees < 0.6 and abs(best_trees - min(h["val_loss"] for h in in_memory_trees.history)) < 0.05
    assert "external memory" in trees.device
    assert min(pages) >= 2, pages  # its pages (the training rows' and the validation rows') were on disk


def test_the_trees_training_loss_is_measured_on_the_first_row_groups(table, monkeypatch):
    """A round's training loss on the whole table copied out its labels and predictions every round (800 MB at 10⁸
    rows): it is measured on the first row groups up to TRAIN_METRIC_ROWS — a uniform sample of the training rows,
    which the join wrote in a seeded random order — and on all of them when they are fewer."""
    from features_party.learn import streamed
    root, _frame, _y = table
    monkeypatch.setattr(joined, "ROW_GROUP_ROWS", 1000)
    monkeypatch.setattr(streamed, "TRAIN_METRIC_ROWS", 2500)
    rows = _join(root, "features", "w6")
    file = pq.ParquetFile(rows.fit.path)
    assert rows.fit.groups >= 10
    trees = fit_gbdt(GbdtConfig(n_estimators=4, learning_rate=0.3), rows.fit, rows.validation, root / "w6" / "xgb")
    assert len(trees.history) == 4

    def loss(frame) -> float:
        numeric, categorical = rows.fit.preprocessor.transform(frame)
        return 0.5 * float(np.mean((trees.predict(numeric, categorical) - frame["label"].to_numpy()) ** 2))

    per_group = rows.fit.rows // rows.fit.groups
    sample = pd.concat([file.read_row_group(g).to_pandas() for g in range(-(-2500 // per_group))])
    assert 2500 <= len(sample) < rows.fit.rows / 3
    assert trees.history[-1]["train_loss"] == pytest.approx(loss(sample), rel=1e-3)
    assert trees.history[-1]["train_loss"] != pytest.approx(loss(file.read().to_pandas()), rel=1e-3)


def test_predictions_cover_every_row_and_mark_the_held_out_ones(table):
    root, frame, _y = table
    rows = _join(root, "features", "w4")
    trees = fit_gbdt(GbdtConfig(n_estimators=5), rows.fit, rows.validation, root / "w4" / "xgb")
    written = joined.predict_table(root / "features", rows.fit.preprocessor, trees.predict, root / "w4" / "p.parquet",
                                   held_out=root / "held.parquet", workdir=root / "w4")
    predictions = pq.read_table(root / "w4" / "p.parquet").to_pandas().set_index("example_id")
    assert written == N and sorted(predictions.index) == sorted(frame.index)
    assert predictions["holdout"].sum() == 1000 and predictions.loc["e999", "holdout"]
    numeric, categorical = rows.fit.preprocessor.transform(frame.loc[["e5", "e30000"]])
    assert np.allclose(predictions.loc[["e5", "e30000"], "prediction"], trees.predict(numeric, categorical))


def test_estimate_rows_are_the_in_memory_jobs_and_neither_trained_nor_validated_on(table):
    root, _frame, y = table
    rows = _join(root, "features", "w5", estimate_fraction=0.1)
    assert rows.estimate is not None
    parts = {name: set(pq.read_table(getattr(rows, name).path).column("example_id").to_pylist())
             for name in ("fit", "validation", "estimate")}
    labelled = y.index[::2].drop(y.index[:1000], errors="ignore")
    assert parts["estimate"] == set(labelled[estimate_mask(labelled, 0.1, 3)])  # the seed of the job's training
    assert parts["estimate"].isdisjoint(parts["fit"] | parts["validation"])
    assert parts["fit"] | parts["validation"] | parts["estimate"] == set(labelled)


def test_a_missing_or_non_numeric_column_is_refused_before_anything_is_written(table, tmp_path):
    root, _frame, _y = table
    from shared.errors import LabelDPError

    with pytest.raises(LabelDPError, match="feature columns missing"):
        joined.join(root / "features", root / "labels.parquet", tmp_path, numeric=["nope"], categorical=[], seed=0,
                    validation_fraction=0.2)
    with pytest.raises(LabelDPError, match="other than numbers"):
        joined.join(root / "features", root / "labels.parquet", tmp_path, numeric=["c"], categorical=[], seed=0,
                    validation_fraction=0.2)
    assert not (tmp_path / "fit.parquet").exists()


# -- a job on an imported table, end to end against a real labels party --------------------------------------------

def _import(parties, frame: pd.DataFrame, name: str = "big") -> None:
    """The table as three Parquet files, imported by the operator's command."""
    from labeldp.cli import main as cli

    source = parties["tmp"] / f"{name}-source"
    source.mkdir()
    for k, part in enumerate(np.array_split(np.arange(len(frame)), 3)):
        pq.write_table(pa.Table.from_pandas(frame.iloc[part], preserve_index=False), source / f"p{k}.parquet")
    settings = parties["trainer_ctx"].settings
    assert cli(["features", "import-features", "--database-url", settings.database_url, "--data-dir",
                str(settings.data_dir), "--org", "publisher", "--name", name, str(source)]) == 0


@pytest.mark.parametrize("model", ["gbdt", "mlp"])
def test_a_job_on_an_imported_table_trains_from_disk_end_to_end(parties, model):
    trainer, features = parties["trainer"], parties["features"]
    _import(parties, features)
    listed = trainer.get("/v1/features/big").json()
    assert listed["num_examples"] == len(features) and listed["columns"] == list(features.columns)
    train = ({"model": "gbdt", "gbdt": {"n_estimators": 80, "learning_rate": 0.2}} if model == "gbdt" else
             {"hidden": [], "epochs": 40, "learning_rate": 0.01, "batch_size": 128, "patience": 40})
    request = {"features": "big", "api_key": parties["consumer"], "dataset_id": parties["dataset"],
               "release": {"mechanism": "opt-unbiased", "epsilon": 4.0}, "numeric": ["x0", "x1"],
               "categorical": ["group"], "split": {"holdout_fraction": 0.2, "seed": 5}, "train": train}
    before = _spent(parties)
    created = trainer.post("/v1/jobs", json=request)
    assert created.status_code == 202, created.text
    job = _finish(trainer, created.json()["id"])
    assert job["status"] == "succeeded", job["error"]
    assert _spent(parties) == pytest.approx(before + 4.0)  # one release, charged once
    held = holdout_mask(features["example_id"], 0.2, 5)
    # its estimate rows (of its own unbiased release, never trained on) compare it with the labels' mean
    assert job["warnings"] == [] and job["estimate"]["better"] and job["estimate"]["mechanism"] == "opt-unbiased"
    kept = estimate_mask(features["example_id"][~held], 0.1, 0)
    assert job["estimate"]["num_examples"] == int(kept.sum())
    assert job["num_train_examples"] == len(features) - int(held.sum()) - int(kept.sum())
    predictions = pd.read_parquet(io.BytesIO(trainer.get(f"/v1/jobs/{job['id']}/predictions", headers={
        "Accept": "application/vnd.apache.parquet"}).content)).set_index("example_id")
    assert len(predictions) == len(features)
    assert predictions["holdout"][features["example_id"]].to_numpy().tolist() == held.tolist()
    # trained on the rows not held out: on the held-out rows, far better than the labels' mean
    truth = parties["labels"][features["example_id"][held]]
    error = np.mean((predictions["prediction"][truth.index] - truth) ** 2)
    assert error < 0.25 * np.var(truth), (error, np.var(truth))
    assert list((parties["tmp"] / "trainer").rglob("rows")) == []  # the joined rows and spill are gone


def test_what_a_job_from_disk_does_not_do_yet_is_refused_before_anything_is_spent(parties):
    trainer = parties["trainer"]
    _import(parties, parties["features"])
    base = {"features": "big", "api_key": parties["consumer"], "dataset_id": parties["dataset"],
            "numeric": ["x0"], "categorical": []}
    before = _spent(parties)
    for release, says in (({"mechanism": "auto", "epsilon": 1.0}, "mechanism 'auto'"),
                          ({"mechanism": "rr", "epsilon": 1.0, "example_ids": ["u1", "u2"]}, "release.example_ids")):
        answer = trainer.post("/v1/jobs", json={**base, "release": release})
        assert answer.status_code == 400 and says in answer.json()["error"]["message"], answer.text
    missing = trainer.post("/v1/jobs", json={**base, "numeric": ["nope"], "release": {"mechanism": "rr",
                                                                                     "epsilon": 1.0}})
    assert missing.status_code == 400 and "feature columns missing" in missing.text
    assert _spent(parties) == before


def test_an_imported_table_with_a_repeated_or_missing_id_is_refused_and_not_kept(parties):
    """The import checks every id once: by their hashes first, then the ids whose hash repeats (grouping 10⁸ ids
    themselves ran out of DuckDB's memory in the scale bench)."""
    from labeldp.cli import main as cli

    settings = parties["trainer_ctx"].settings
    for name, ids in (("twice", ["a", "b", "c", "b"]), ("missing", ["a", None, "c", "d"])):
        source = parties["tmp"] / f"{name}-source"
        source.mkdir()
        pq.write_table(pa.table({"example_id": ids, "x0": [1.0, 2.0, 3.0, 4.0]}), source / "p.parquet")
        assert cli(["features", "import-features", "--database-url", settings.database_url, "--data-dir",
                    str(settings.data_dir), "--org", "publisher", "--name", name, str(source)]) != 0
        assert parties["trainer"].get(f"/v1/features/{name}").status_code == 404
    assert not list((parties["tmp"] / "trainer").rglob("*.dataset"))


def test_a_job_whose_join_would_run_out_of_memory_is_refused_before_its_charge(parties):
    """The 10⁸-row bench: both jobs' joins ran out of DuckDB's 488 MiB after their release was charged. A job whose
    released labels would need more than ``table_read_budget_bytes`` to join (16 bytes a label) is refused first."""
    from tests.features_party.test_api import trainer_client, trainer_context

    ctx = trainer_context(parties["tmp"] / "small", parties["labels_url"], table_read_budget_bytes=20_000)
    try:
        trainer = trainer_client(ctx, "publisher")
        _import({**parties, "trainer_ctx": ctx}, parties["features"], name="small")
        before = _spent(parties)
        answer = trainer.post("/v1/jobs", json={
            "features": "small", "api_key": parties["consumer"], "dataset_id": parties["dataset"],
            "release": {"mechanism": "rr", "epsilon": 1.0}, "numeric": ["x0"], "categorical": [],
            "train": {"model": "gbdt"}})
        assert answer.status_code == 400 and answer.json()["error"]["code"] == "job_too_large", answer.text
        assert "1,500 released labels" in answer.json()["error"]["message"] and _spent(parties) == before
    finally:
        ctx.jobs.stop()
        ctx.close()
