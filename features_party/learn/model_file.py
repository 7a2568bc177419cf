"""An MLP job's model file (the ``.npz`` :func:`features_party.learn.train.save_model` writes): checked as strictly as a
tree file (:mod:`features_party.learn.gbdt_file`) before anything it describes is allocated — ``labeldp predict`` reads
files from wherever the user keeps them, edited or from elsewhere.

The review of issue 40 found a 1.7 KB file whose header described a huge network (6.8 GB allocated, then an internal
error), a 778 KB one with wrong-shaped weights accepted, headers of 100k nested brackets (a RecursionError) and
several shapes giving "internal error". So, in order, with nothing large read before it is known to be right:

* the file is at most :data:`features_party.learn.gbdt.MAX_MODEL_BYTES`, a zip of ``header.npy`` and ``leaf_NNNN.npy``
  members only, none over its expected size once decompressed (the zip's own sizes, checked as it is read);
* the header is a string of at most :data:`MAX_HEADER_CHARS`, JSON of bounded depth, with every field checked: the
  network's shape within the job schema's ranges and at most :data:`MAX_PARAMETERS` numbers, the options a job could
  have had, the preprocessing (:meth:`Preprocessor.from_file`) matching the network's inputs, finite scalars;
* each leaf's ``.npy`` header (numpy's, its size capped) says float32 of exactly the shape the network needs, in the
  order the trainer saved them — computed abstractly (``jax.eval_shape``), nothing allocated — and only then is it read.

Any failure is one ``malformed_file`` error; nothing of the file is echoed.
"""

from __future__ import annotations

import json
import math
import zipfile
from pathlib import Path
from typing import Any

import jax
import numpy as np
from pydantic import ValidationError

from features_party.features import Preprocessor
from features_party.learn import losses
from features_party.learn.gbdt import MAX_CATEGORIES, MAX_MODEL_BYTES
from features_party.learn.train import TrainConfig, TrainResult
from features_party.schemas import TrainOptions
from shared import models
from shared.errors import ErrorCode, LabelDPError

MAX_HEADER_CHARS = 1 << 24  # 16 M characters: a history of 1000 epochs and vocabularies are far less
MAX_PARAMETERS = 1 << 28  # 1 GiB of float32: beyond what a trainer job may train (max_mlp_bytes)
MAX_HISTORY = 1 << 20
MAX_COLUMNS, MAX_CLASSES = 1000, 100_000  # the job schema's: feature columns of one kind, classes
HEADER_FIELDS = {"spec", "config", "preprocessing", "target_shift", "target_scale", "best_epoch", "history"}


class _Malformed(Exception):
    """A check failed (its message is for tests; the user sees one generic line)."""


def load_model(path: str | Path, *, max_bytes: int = MAX_MODEL_BYTES) -> tuple[TrainResult, dict]:
    """The network and header of an MLP model file, checked (module docstring) before its weights are read."""
    size = Path(path).stat().st_size
    if size > max_bytes:
        raise LabelDPError(f"the model file has {size:,} bytes, more than {max_bytes:,}: not a labeldp job's MLP",
                           code=ErrorCode.MALFORMED_FILE)
    try:
        return _load(Path(path), max_bytes)
    except (_Malformed, zipfile.BadZipFile, KeyError, TypeError, ValueError, IndexError, OverflowError,
            RecursionError, ValidationError, EOFError, UnicodeDecodeError) as err:
        raise LabelDPError("the model file is not a labeldp job's MLP (or it was damaged)",
                           code=ErrorCode.MALFORMED_FILE) from err


def _load(path: Path, max_bytes: int) -> tuple[TrainResult, dict]:
    with zipfile.ZipFile(path) as archive:
        members = {info.filename: info for info in archive.infolist()}
        leaves = sorted(name for name in members if name.startswith("leaf_"))
        if set(members) != {"header.npy", *leaves} or leaves != [f"leaf_{i:04d}.npy" for i in range(len(leaves))]:
            raise _Malformed("members")
        if sum(info.file_size for info in members.values()) > max_bytes:
            raise _Malformed("decompressed size")
        header = _header(_read(archive, members["header.npy"], shape=(), kind="U"))
        spec, preprocessor = _spec(header["spec"]), Preprocessor.from_file(header["preprocessing"], MAX_CATEGORIES)
        if spec.num_numeric != len(preprocessor.numeric) \
                or spec.vocab_sizes != tuple(len(v) + 1 for v in preprocessor.vocabularies):
            raise _Malformed("the network's inputs are not the preprocessing's")
        shapes = jax.eval_shape(lambda: models.init_params(jax.random.PRNGKey(0), spec))
        expected, structure = jax.tree_util.tree_flatten(shapes)
        if len(expected) != len(leaves):
            raise _Malformed("leaves")
        arrays = [_read(archive, members[name], shape=tuple(want.shape), kind="f")
                  for name, want in zip(leaves, expected, strict=True)]
    if not all(np.all(np.isfinite(a)) for a in arrays):
        raise _Malformed("weights not finite")
    params = jax.tree_util.tree_unflatten(structure, [jax.numpy.asarray(a) for a in arrays])
    config = _config(header["config"], spec)
    result = TrainResult(params, spec, config, _number(header["target_shift"]),
                         _number(header["target_scale"], positive=True), _count(header["best_epoch"]),
                         _history(header["history"]))
    return result, header


def _read(archive: zipfile.ZipFile, info: zipfile.ZipInfo, *, shape: tuple, kind: str) -> np.ndarray:
    """A member's array once its ``.npy`` header says it is float32 of ``shape`` (``kind`` "f"), or a unicode
    scalar of at most :data:`MAX_HEADER_CHARS` (``kind`` "U"), and the member is that size."""
    with archive.open(info) as handle:
        version = np.lib.format.read_magic(handle)
        if version == (1, 0):
            found, fortran, dtype = np.lib.format.read_array_header_1_0(handle)
        elif version in ((2, 0), (3, 0)):
            found, fortran, dtype = np.lib.format.read_array_header_2_0(handle)
        else:
            raise _Malformed("npy version")
        offset = handle.tell()
    if tuple(found) != shape:
        raise _Malformed("a leaf's shape is not the network's")
    if kind == "f":
        if dtype != np.dtype("<f4"):
            raise _Malformed("weights not float32")
    elif dtype.kind != "U" or dtype.itemsize // 4 > MAX_HEADER_CHARS:
        raise _Malformed("header dtype")
    if info.file_size != offset + dtype.itemsize * math.prod(shape):
        raise _Malformed("member size")
    with archive.open(info) as handle:
        return np.lib.format.read_array(handle, allow_pickle=False)


def _header(array: np.ndarray) -> dict:
    header = json.loads(str(array))  # RecursionError for a bracket bomb: caught as malformed
    if not isinstance(header, dict) or not HEADER_FIELDS <= set(header):
        raise _Malformed("header fields")
    return header


def _integer(value: Any, low: int, high: int) -> int:
    if type(value) is not int or not low <= value <= high:
        raise _Malformed("an integer out of range")
    return value


def _spec(data: Any) -> models.ModelSpec:
    if not isinstance(data, dict) or set(data) != {"num_numeric", "vocab_sizes", "embed_dim", "hidden",
                                                    "output_dim"}:
        raise _Malformed("spec fields")
    if not isinstance(data["vocab_sizes"], list) or not isinstance(data["hidden"], list) \
            or len(data["vocab_sizes"]) > MAX_COLUMNS or len(data["hidden"]) > 8:
        raise _Malformed("spec lists")
    spec = models.ModelSpec(
        _integer(data["num_numeric"], 0, MAX_COLUMNS),
        tuple(_integer(v, 1, MAX_CATEGORIES + 1) for v in data["vocab_sizes"]),
        _integer(data["embed_dim"], 1, 256), tuple(_integer(h, 1, 4096) for h in data["hidden"]),
        _integer(data["output_dim"], 1, MAX_CLASSES))
    if models.num_params(spec) > MAX_PARAMETERS:
        raise _Malformed("too many parameters")
    return spec


def _config(data: Any, spec: models.ModelSpec) -> TrainConfig:
    """The options, as a job could have had them (TrainOptions' ranges, strictly typed), and a loss that fits the
    network's outputs."""
    if not isinstance(data, dict):
        raise _Malformed("config")
    fields = {name: data[name] for name in ("hidden", "embed_dim", "learning_rate", "l2", "batch_size", "epochs",
                                            "patience", "validation_fraction", "seed", "standardize_targets")}
    TrainOptions.model_validate(fields, strict=True)
    loss = data["loss"]
    if loss not in losses.LOSSES or set(data) != set(fields) | {"loss"}:
        raise _Malformed("config fields")
    outputs = 1 if loss in ("squared", "poisson") else spec.output_dim
    if spec.output_dim != outputs or (outputs > 1) != (loss in losses.CLASS_LOSSES):
        raise _Malformed("a loss that does not fit the outputs")
    return TrainConfig.from_dict(data)


def _number(value: Any, *, positive: bool = False) -> float:
    if type(value) not in (int, float) or not math.isfinite(value) or (positive and not value > 0):
        raise _Malformed("a number")
    return float(value)


def _count(value: Any) -> int:
    return _integer(value, 0, MAX_HISTORY)


def _history(value: Any) -> list[dict]:
    if not isinstance(value, list) or len(value) > MAX_HISTORY or not all(isinstance(h, dict) for h in value):
        raise _Malformed("history")
    return value
