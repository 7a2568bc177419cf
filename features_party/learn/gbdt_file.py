"""A tree job's model file: XGBoost's JSON with our header in its ``labeldp`` attribute — written by the trainer,
read back by ``labeldp predict`` from wherever the user keeps it.

A model file is input: it may have been edited or come from elsewhere. XGBoost's loader trusts the structure it
reads — a ``tree_info`` entry or a child index out of range is a heap write outside its buffers (glibc aborts;
a crafted one could do worse), a category code of 2²⁴ − 1 in 900 splits allocated 2 GB, two million nested
brackets overflow its parser's stack. So :func:`load_model` parses the file in Python first (size-capped, depth-
bounded) and checks everything XGBoost indexes with against the header's own preprocessing — shapes, child indices
(each child after its parent, each node but the root a child once: a tree, no loop), feature indices, class
indices, category codes within the header's vocabularies, finite numbers — and only then hands XGBoost the bytes it
checked. Any failure is one ``malformed_file`` error; nothing of the file is echoed.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import xgboost as xgb
from pydantic import ValidationError

from features_party.features import Preprocessor
from features_party.learn.gbdt import MAX_CATEGORIES, MAX_MODEL_BYTES, OBJECTIVES, GbdtConfig, GbdtResult
from features_party.schemas import GbdtOptions
from shared.errors import ErrorCode, LabelDPError

ATTRIBUTE = "labeldp"  # the model's string attribute holding our header (JSON)
MAX_CLASSES = 1 << 20
MAX_HISTORY = 1 << 20  # rounds recorded in the header (n_estimators × stages is at most 10⁴ × 10)
ROOT_PARENT = (1 << 31) - 1  # the root's parent as XGBoost writes it
CATEGORY_ARRAYS = ("categories_nodes", "categories_segments", "categories_sizes")


class _Malformed(Exception):
    """A check failed (its message is for tests; the user sees one generic line)."""


def save_model(path: str | Path, result: GbdtResult, preprocessing: dict, extra: dict | None = None) -> None:
    """XGBoost's JSON model, its ``labeldp`` attribute the header (config, preprocessing, best round, history)."""
    header = {"family": "gbdt", "config": asdict(result.config), "preprocessing": preprocessing,
              "num_classes": result.num_classes, "best_epoch": result.best_epoch, "history": result.history,
              **(extra or {})}
    result.booster.set_attr(**{ATTRIBUTE: json.dumps(header)})
    Path(path).write_bytes(bytes(result.booster.save_raw("json")))


def is_model_file(path: str | Path) -> bool:
    """A tree model (XGBoost JSON, starting with ``{``) rather than the MLP's .npz (a zip, starting with ``PK``)."""
    with open(path, "rb") as handle:
        return handle.read(1) == b"{"


def load_model(path: str | Path, *, max_bytes: int = MAX_MODEL_BYTES) -> tuple[GbdtResult, dict]:
    """The trees and header of a model file, checked (module docstring) before XGBoost reads a byte of it."""
    size = Path(path).stat().st_size
    if size > max_bytes:
        raise LabelDPError(f"the model file has {size:,} bytes, more than {max_bytes:,}: not a labeldp job's trees",
                           code=ErrorCode.MALFORMED_FILE)
    raw = Path(path).read_bytes()
    try:
        header, config = check_model(raw)
    except _Malformed:
        raise LabelDPError("the model file is not a labeldp job's tree model (or it was damaged)",
                           code=ErrorCode.MALFORMED_FILE) from None
    try:
        booster = xgb.Booster(model_file=bytearray(raw))
    except xgb.core.XGBoostError:
        raise LabelDPError("the model file is not an XGBoost model XGBoost can read",
                           code=ErrorCode.MALFORMED_FILE) from None
    return GbdtResult(booster, config, int(header["best_epoch"]), list(header["history"]),
                      num_classes=header["num_classes"]), header


def check_model(raw: bytes) -> tuple[dict, GbdtConfig]:
    """The header and config of a model file whose structure XGBoost may index with; :class:`_Malformed` else."""
    try:
        document = json.loads(raw)
    except (ValueError, RecursionError) as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise _Malformed("not JSON") from err
    try:
        return _check(document)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, OverflowError, ValidationError) as err:
        raise _Malformed(f"{type(err).__name__}: {err}") from err


def _int(value: Any) -> int:
    """XGBoost writes its parameters as strings of integers."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError("not an integer")
    return int(value)


def _array(tree: dict, name: str, size: int, kind: type) -> np.ndarray:
    """A node array of ``size`` integers (``kind`` int) or finite numbers (float): JSON numbers, nothing else."""
    values = tree[name]
    if not isinstance(values, list) or len(values) != size:
        raise ValueError(f"{name} has the wrong length")
    allowed = (int,) if kind is int else (int, float)
    if not all(type(v) in allowed for v in values):
        raise TypeError(f"{name} holds something other than numbers")
    array = np.asarray(values, dtype=np.int64 if kind is int else np.float64)
    if kind is float and not np.all(np.isfinite(array)):
        raise ValueError(f"{name} is not finite")
    return array


def _check(document: dict) -> tuple[dict, GbdtConfig]:
    learner = document["learner"]
    header = json.loads(learner["attributes"][ATTRIBUTE])
    if not isinstance(header, dict) or header.get("family") != "gbdt":
        raise ValueError("not a labeldp tree header")
    config = _check_config(header["config"])
    classes = header["num_classes"]  # K for class labels, else None
    if config.loss == "cross_entropy":
        if type(classes) is not int or not 2 <= classes <= MAX_CLASSES:
            raise ValueError("num_classes")
    elif classes is not None:
        raise ValueError("num_classes without class labels")
    preprocessor = Preprocessor.from_file(header["preprocessing"], MAX_CATEGORIES)
    history = header["history"]
    if not isinstance(history, list) or len(history) > MAX_HISTORY or not all(isinstance(h, dict) for h in history):
        raise TypeError("history")
    numeric, vocab = len(preprocessor.numeric), [len(v) + 1 for v in preprocessor.vocabularies]
    features = numeric + len(vocab)
    if learner["feature_types"] != ["q"] * numeric + ["c"] * len(vocab) or learner["feature_names"] != []:
        raise ValueError("feature types or names differ from the preprocessing")
    if learner["objective"]["name"] != OBJECTIVES[config.loss]:
        raise ValueError("objective")
    parameters = learner["learner_model_param"]
    outputs = classes or 1
    if _int(parameters["num_class"]) != (classes or 0) or _int(parameters["num_feature"]) != features \
            or _int(parameters["num_target"]) != 1:
        raise ValueError("model parameters differ from the header")
    base = [float(v) for v in str(parameters["base_score"]).strip("[]").split(",")]
    if len(base) != outputs or not np.all(np.isfinite(base)):
        raise ValueError("base_score")
    booster = learner["gradient_booster"]
    if booster["name"] != "gbtree":
        raise ValueError("not a tree booster")
    model = booster["model"]
    if any(model["cats"][key] for key in ("enc", "feature_segments", "sorted_idx")):
        raise ValueError("XGBoost's own category encoding (a labeldp model passes codes)")
    trees, shape = model["trees"], model["gbtree_model_param"]
    count = _int(shape["num_trees"])
    if not isinstance(trees, list) or len(trees) != count or _int(shape["num_parallel_tree"]) != 1:
        raise ValueError("tree count")
    if type(header["best_epoch"]) is not int or not 0 <= header["best_epoch"] <= count:
        raise ValueError("best_epoch")
    groups = np.asarray(model["tree_info"], dtype=np.int64) if count else np.zeros(0, np.int64)
    if groups.shape != (count,) or np.any(groups < 0) or np.any(groups >= outputs):
        raise ValueError("tree_info")
    pointers = np.asarray(model["iteration_indptr"], dtype=np.int64)
    if pointers.ndim != 1 or pointers.size < 1 or pointers[0] != 0 or pointers[-1] != count \
            or np.any(np.diff(pointers) < 0):
        raise ValueError("iteration_indptr")
    for index, tree in enumerate(trees):
        _check_tree(tree, index, features, numeric, vocab, config.max_depth)
    return header, config


def _check_config(fields: dict) -> GbdtConfig:
    """The trees' options within the job schema's ranges (GbdtOptions), a tree loss, a split and a seed."""
    config = GbdtConfig.from_dict(fields)
    options = {name: getattr(config, name) for name in GbdtOptions.model_fields}
    GbdtOptions.model_validate(options, strict=True)
    if config.loss not in OBJECTIVES or type(config.seed) is not int \
            or not 0 <= float(config.validation_fraction) < 1:
        raise ValueError("config")
    return config


def _check_tree(tree: dict, index: int, features: int, numeric: int, vocab: list[int], max_depth: int) -> None:
    parameters = tree["tree_param"]
    size = _int(parameters["num_nodes"])
    if _int(tree["id"]) != index or not 1 <= size <= (1 << (max_depth + 1)) - 1 \
            or _int(parameters["num_feature"]) != features \
            or _int(parameters["size_leaf_vector"]) not in (0, 1) or _int(parameters["num_deleted"]) != 0:
        raise ValueError("tree parameters")
    left, right = _array(tree, "left_children", size, int), _array(tree, "right_children", size, int)
    split_index, split_type = _array(tree, "split_indices", size, int), _array(tree, "split_type", size, int)
    parents = _array(tree, "parents", size, int)
    if not np.isin(_array(tree, "default_left", size, int), (0, 1)).all():
        raise ValueError("default_left")
    for name in ("base_weights", "loss_changes", "split_conditions", "sum_hessian"):
        _array(tree, name, size, float)
    leaf = left == -1
    nodes = np.arange(size)
    if np.any((right == -1) != leaf):
        raise ValueError("a node with one child")
    children = np.concatenate([left[~leaf], right[~leaf]])
    # a tree: every child after its parent (no loop), inside the tree, and every node but the root a child once
    if np.any(left[~leaf] <= nodes[~leaf]) or np.any(right[~leaf] <= nodes[~leaf]) or np.any(children >= size) \
            or children.size != size - 1 or np.unique(children).size != children.size:
        raise ValueError("children")
    if parents[0] != ROOT_PARENT or np.any(parents[left[~leaf]] != nodes[~leaf]) \
            or np.any(parents[right[~leaf]] != nodes[~leaf]):
        raise ValueError("parents")
    # no deeper than the header's max_depth: a chain of 10⁶ nodes passed every check above and crashed XGBoost's
    # prediction (its traversal recursed); a level at a time, each a node's children
    level, depth = np.array([0]), 0
    while True:
        level = level[~leaf[level]]
        if not level.size:
            break
        depth += 1
        if depth > max_depth:
            raise ValueError("a tree deeper than max_depth")
        level = np.concatenate([left[level], right[level]])
    inner = ~leaf
    if np.any(split_index[inner] < 0) or np.any(split_index[inner] >= features) \
            or np.any((split_type != 0) & (split_type != 1)) or np.any(split_type[leaf] != 0):
        raise ValueError("splits")
    categorical = inner & (split_type == 1)
    if np.any(split_index[categorical] < numeric):
        raise ValueError("a categorical split on a numeric feature")
    _check_categories(tree, size, categorical, split_index, numeric, vocab)


def _check_categories(tree: dict, size: int, categorical: np.ndarray, split_index: np.ndarray, numeric: int,
                      vocab: list[int]) -> None:
    values = tree["categories"]
    if not isinstance(values, list):
        raise TypeError("categories")
    codes = np.asarray(values, dtype=np.int64) if values else np.zeros(0, np.int64)
    listed = [tree[name] for name in CATEGORY_ARRAYS]
    if not all(isinstance(a, list) and len(a) == len(listed[0]) for a in listed):
        raise ValueError("category arrays")
    nodes, segments, sizes = (np.asarray(a, dtype=np.int64) if a else np.zeros(0, np.int64) for a in listed)
    if np.any(nodes < 0) or np.any(nodes >= size) or np.unique(nodes).size != nodes.size \
            or not np.array_equal(np.sort(nodes), np.flatnonzero(categorical)):
        raise ValueError("categories_nodes")
    if np.any(segments < 0) or np.any(sizes < 0) or np.any(segments + sizes > codes.size):
        raise ValueError("categories_segments")
    for node, start, count in zip(nodes, segments, sizes, strict=True):
        levels = vocab[int(split_index[node]) - numeric]
        chosen = codes[start:start + count]
        if np.any(chosen < 0) or np.any(chosen >= levels):
            raise ValueError("a category code outside the column's vocabulary")
