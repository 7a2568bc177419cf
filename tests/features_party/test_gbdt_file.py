"""A tree model file is input (features_party/learn/gbdt_file.py): ``labeldp predict`` checks it in Python before
XGBoost reads it. A real job-shaped model (3 classes, a categorical column) round-trips; each of the review's hostile
edits — which made XGBoost write outside its buffers, segfault, or allocate gigabytes — is one ``malformed_file`` line;
and a control shows that XGBoost itself, handed the same bytes unchecked, dies of a signal."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import numpy as np
import pytest

from features_party.learn import gbdt
from features_party.learn.gbdt_file import check_model, load_model, save_model
from labeldp.cli import main as cli
from shared.errors import LabelDPError

PREPROCESSING = {"numeric": ["x0", "x1"], "categorical": ["g"], "means": [0.0, 0.0], "stds": [1.0, 1.0],
                 "vocabularies": [["a", "b", "c", "d"]]}


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> tuple[bytes, gbdt.GbdtResult]:
    rng = np.random.default_rng(3)
    numeric, categorical = rng.normal(size=(600, 2)), rng.integers(1, 5, size=(600, 1))
    classes = np.where(numeric[:, 0] > 0, categorical[:, 0] % 3, 2)
    config = gbdt.GbdtConfig(loss="cross_entropy", n_estimators=8, max_depth=3, min_child_weight=1,
                             early_stopping_rounds=100)
    result = gbdt.train_gbdt(config, numeric, categorical, classes, num_classes=3, threads=1)
    path = tmp_path_factory.mktemp("model") / "trees.json"
    save_model(path, result, PREPROCESSING)
    document = json.loads(path.read_bytes())
    assert any(t["categories_nodes"] for t in document["learner"]["gradient_booster"]["model"]["trees"])
    return path.read_bytes(), result


def _trees(document: dict) -> list[dict]:
    return document["learner"]["gradient_booster"]["model"]["trees"]


def _first_split(tree: dict) -> int:
    return int(np.flatnonzero(np.asarray(tree["left_children"]) != -1)[0])


def _categorical_tree(document: dict) -> dict:
    return next(t for t in _trees(document) if t["categories_nodes"])


def _header(document: dict, **changes) -> None:
    header = json.loads(document["learner"]["attributes"]["labeldp"])
    header["preprocessing"] = {**header["preprocessing"], **changes}
    document["learner"]["attributes"]["labeldp"] = json.dumps(header)


EDITS = {
    "tree_info negative": lambda d: d["learner"]["gradient_booster"]["model"]["tree_info"].__setitem__(0, -1000),
    "tree_info past the classes": lambda d: d["learner"]["gradient_booster"]["model"]["tree_info"].__setitem__(0, 7),
    "tree_info huge": lambda d: d["learner"]["gradient_booster"]["model"]["tree_info"].__setitem__(0, 10**8),
    "child past the end": lambda d: _trees(d)[0]["left_children"].__setitem__(0, 10**6),
    "negative child": lambda d: _trees(d)[0]["right_children"].__setitem__(0, -7),
    "a node its own child (a loop)": lambda d: _trees(d)[0]["left_children"].__setitem__(
        _first_split(_trees(d)[0]), _first_split(_trees(d)[0])),
    "split feature out of range": lambda d: _trees(d)[0]["split_indices"].__setitem__(0, 10**8),
    "category segment out of range": lambda d: _categorical_tree(d)["categories_segments"].__setitem__(0, 10**9),
    "category code 2^24 - 1": lambda d: _categorical_tree(d)["categories"].__setitem__(0, (1 << 24) - 1),
    "category code past the vocabulary": lambda d: _categorical_tree(d)["categories"].__setitem__(0, 5),
    "node count and arrays differ": lambda d: _trees(d)[0]["tree_param"].__setitem__("num_nodes", "999"),
    "num_feature huge": lambda d: d["learner"]["learner_model_param"].__setitem__("num_feature", "2000000000"),
    "num_class huge": lambda d: d["learner"]["learner_model_param"].__setitem__("num_class", "2000000000"),
    "a string where a number goes": lambda d: _trees(d)[0]["split_conditions"].__setitem__(0, "0.5"),
    "a non-finite threshold": lambda d: _trees(d)[0]["split_conditions"].__setitem__(0, float("nan")),
    "XGBoost's own category encoder": lambda d: d["learner"]["gradient_booster"]["model"]["cats"].__setitem__(
        "enc", [1]),
    "feature types swapped": lambda d: d["learner"].__setitem__("feature_types", ["c", "q", "q"]),
    "empty preprocessing": lambda d: d["learner"]["attributes"].__setitem__(
        "labeldp", json.dumps({**json.loads(d["learner"]["attributes"]["labeldp"]), "preprocessing": {}})),
    "numeric columns not a list": lambda d: _header(d, numeric=5),
    "means and columns differ": lambda d: _header(d, means=[0.0]),
    "no header": lambda d: d["learner"]["attributes"].pop("labeldp"),
    # the second review's: a chain deeper than the header's max_depth (10⁶ levels crashed XGBoost's prediction),
    # a class count beyond the header's (2²⁰ classes took gigabytes to predict), and what XGBoost refuses only late
    "a tree deeper than max_depth": lambda d: _chain(_trees(d)[0], 5),
    "num_class other than the header's": lambda d: d["learner"]["learner_model_param"].__setitem__("num_class", "4"),
    "no num_classes in the header": lambda d: _edit_header(d, num_classes=None),
    "another objective": lambda d: d["learner"]["objective"].__setitem__("name", "reg:squarederror"),
    "base_score of the wrong length": lambda d: d["learner"]["learner_model_param"].__setitem__(
        "base_score", "[0.5,0.5]"),
    "feature names": lambda d: d["learner"].__setitem__("feature_names", ["a", "b", "c"]),
    "default_left of 7": lambda d: _trees(d)[0]["default_left"].__setitem__(0, 7),
    "a categorical split type on a leaf": lambda d: _trees(d)[0]["split_type"].__setitem__(
        _trees(d)[0]["left_children"].index(-1), 1),
    "an unknown loss": lambda d: _edit_header(d, config={**_header_of(d)["config"], "loss": "bogus"}),
    "a depth beyond the options' range": lambda d: _edit_header(d, config={**_header_of(d)["config"],
                                                                            "max_depth": 40}),
    "a string for a number of rounds": lambda d: _edit_header(d, config={**_header_of(d)["config"],
                                                                          "n_estimators": "x"}),
    "best_epoch past the trees": lambda d: _edit_header(d, best_epoch=10**30),
    "a history of strings": lambda d: _edit_header(d, history=["x"] * 3),
}


def _header_of(document: dict) -> dict:
    return json.loads(document["learner"]["attributes"]["labeldp"])


def _edit_header(document: dict, **changes) -> None:
    document["learner"]["attributes"]["labeldp"] = json.dumps({**_header_of(document), **changes})


def _chain(tree: dict, depth: int) -> None:
    """Replace ``tree`` with a consistent chain of ``depth`` splits on feature 0: each even node i < 2·depth splits,
    its left child i + 1 a leaf, its right child i + 2 the next split (node 2·depth a leaf)."""
    size = 2 * depth + 1
    right = [i + 2 if i % 2 == 0 and i < 2 * depth else -1 for i in range(size)]
    left = [i + 1 if i % 2 == 0 and i < 2 * depth else -1 for i in range(size)]
    parents = [(1 << 31) - 1] + [i - 1 if i % 2 == 1 else i - 2 for i in range(1, size)]
    tree.update({"left_children": left, "right_children": right, "parents": parents,
                 "split_indices": [0] * size, "split_type": [0] * size, "default_left": [0] * size,
                 "split_conditions": [0.0] * size, "base_weights": [0.0] * size, "loss_changes": [0.0] * size,
                 "sum_hessian": [1.0] * size, "categories": [], "categories_nodes": [], "categories_segments": [],
                 "categories_sizes": []})
    tree["tree_param"]["num_nodes"] = str(size)


def test_a_chain_within_max_depth_passes(model):
    """The chain the depth edit builds is itself a well-formed tree: at depth 3 (the model's max_depth) the check
    accepts it, so the edit above is refused for its depth alone."""
    document = copy.deepcopy(json.loads(model[0]))
    _chain(_trees(document)[0], 3)
    check_model(json.dumps(document).encode())


def test_a_job_model_round_trips(model, tmp_path):
    raw, result = model
    path = tmp_path / "trees.json"
    path.write_bytes(raw)
    loaded, header = load_model(path)
    assert header["preprocessing"] == PREPROCESSING and loaded.best_epoch == result.best_epoch
    rng = np.random.default_rng(4)
    numeric, categorical = rng.normal(size=(50, 2)), rng.integers(0, 5, size=(50, 1))
    np.testing.assert_array_equal(loaded.predict(numeric, categorical), result.predict(numeric, categorical))


@pytest.mark.parametrize("edit", list(EDITS))
def test_a_hostile_edit_is_one_malformed_file_error(model, tmp_path, capsys, edit):
    document = copy.deepcopy(json.loads(model[0]))
    EDITS[edit](document)
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps(document))
    with pytest.raises(LabelDPError) as refused:
        load_model(path)
    assert refused.value.code == "malformed_file"
    features = tmp_path / "features.csv"
    features.write_text("example_id,x0,x1,g\nu,0.5,1.0,a\nv,-1.0,0.0,d\n")
    assert cli(["predict", "--model", str(path), "--features", str(features), "--out", str(tmp_path / "p.csv")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a labeldp job's tree model" in err[0], err


def test_deep_nesting_and_an_oversized_file_are_refused_before_parsing(model, tmp_path):
    nested = tmp_path / "nested.json"
    nested.write_text("[" * 2_000_000 + "]" * 2_000_000)  # XGBoost's parser recursed until its stack ran out
    with pytest.raises(LabelDPError, match="not a labeldp job's tree model"):
        load_model(nested)
    big = tmp_path / "big.json"
    big.write_bytes(model[0])
    with pytest.raises(LabelDPError, match="bytes, more than 1,000:"):
        load_model(big, max_bytes=1000)
    with pytest.raises(Exception, match="not JSON"):
        check_model(b"\xff\xfe")


CONTROL = """
import sys, numpy as np, xgboost as xgb
booster = xgb.Booster(model_file=bytearray(open(sys.argv[1], "rb").read()))
print(booster.predict(xgb.DMatrix(np.zeros((4, 3), np.float32), feature_types=["q", "q", "c"],
                                  enable_categorical=True)))
"""


def test_control_unchecked_xgboost_dies_on_such_a_file(model, tmp_path):
    """Why the check exists: the same edit handed to XGBoost directly kills the process with a signal (a
    segmentation fault here), where labeldp predict answers one line."""
    document = copy.deepcopy(json.loads(model[0]))
    EDITS["tree_info huge"](document)
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps(document))
    control = subprocess.run([sys.executable, "-c", CONTROL, str(path)], capture_output=True, timeout=120)
    assert control.returncode < 0, (control.returncode, control.stderr[-400:])
