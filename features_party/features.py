"""Feature tables and their preprocessing (fitted on training features only; saved with the model)."""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from shared.errors import LabelDPError, library_message, resource_error

ID = "example_id"


def read_features(path: str | Path, what: str = "features") -> pd.DataFrame:
    """A features CSV (or another CSV keyed by example id: ``what`` names it in messages) with an ``example_id``
    column and unique ids."""
    try:
        with open(path, "rb") as handle:  # a handle, not the path: no library message can name the spooled file
            frame = pd.read_csv(handle, dtype={ID: str}, keep_default_na=True)
    except (ValueError, OSError) as err:  # pandas' ParserError, EmptyDataError and UnicodeDecodeError among them
        raise resource_error(err) or LabelDPError(f"cannot parse {what} file: {library_message(err)}",
                                                  code="malformed_file") from None
    return check_features(frame, what)


def store_frame(directory: Path, name: str, frame: pd.DataFrame) -> Path:
    """``frame`` (keyed by example id) as ``directory/name.parquet``, replaced at once: a reader sees the old file or
    the new one, never half of one."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"{name}.parquet"
    staged = directory / f".{name}.{uuid.uuid4().hex}.tmp"  # collected at startup if a crash leaves it
    frame.reset_index(drop=True).to_parquet(staged, index=False)
    staged.replace(target)
    return target


def check_features(frame: pd.DataFrame, what: str = "features") -> pd.DataFrame:
    if ID not in frame.columns:
        raise LabelDPError(f"the {what} file needs an {ID!r} column", code="malformed_file")
    if frame[ID].isna().any():
        raise LabelDPError("an example_id is missing", code="malformed_file")
    frame = frame.assign(**{ID: frame[ID].astype(str)})
    duplicated = frame[ID].duplicated()
    if duplicated.any():
        raise LabelDPError(f"duplicate example_id {frame[ID][duplicated].iloc[0]!r} in {what}",
                           code="duplicate_example_id")
    return frame.set_index(ID, drop=False)


@dataclass(frozen=True)
class Preprocessor:
    """Standardize numeric columns; map categorical values to 1..V (0 = unseen)."""

    numeric: tuple[str, ...]
    categorical: tuple[str, ...]
    means: tuple[float, ...] = ()
    stds: tuple[float, ...] = ()
    vocabularies: tuple[tuple[str, ...], ...] = field(default=())

    @staticmethod
    def check(frame: pd.DataFrame, numeric, categorical) -> None:
        """The columns exist and the numeric ones are numbers, on every row (what ``fit`` needs of any subset)."""
        missing = [c for c in tuple(numeric) + tuple(categorical) if c not in frame.columns]
        if missing:
            raise LabelDPError(f"feature columns not in the features file: {missing}", code="malformed_file")
        if "example_id" in tuple(numeric) + tuple(categorical):
            raise LabelDPError("example_id is the key, not a feature", code="malformed_file")
        _numeric(frame, tuple(numeric))

    @classmethod
    def fit(cls, frame: pd.DataFrame, numeric, categorical) -> Preprocessor:
        """Fitted on ``frame`` alone: pass the rows the model trains on (never held-out rows)."""
        numeric, categorical = tuple(numeric), tuple(categorical)
        cls.check(frame, numeric, categorical)
        values = _numeric(frame, numeric)
        means = values.mean(axis=0) if len(frame) else np.zeros(len(numeric))
        stds = values.std(axis=0) if len(frame) else np.ones(len(numeric))
        vocabularies = tuple(tuple(sorted(frame[c].astype(str).unique())) for c in categorical)
        return cls(numeric, categorical, tuple(float(m) for m in means),
                   tuple(float(s) if s > 0 else 1.0 for s in stds), vocabularies)

    @property
    def vocab_sizes(self) -> tuple[int, ...]:
        return tuple(len(v) + 1 for v in self.vocabularies)

    def transform(self, frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        missing = [c for c in self.numeric + self.categorical if c not in frame.columns]
        if missing:
            raise LabelDPError(f"feature columns missing: {missing}", code="malformed_file")
        numeric = (_numeric(frame, self.numeric) - np.array(self.means)) / np.array(self.stds)
        # float32 for the learners: a row far outside the training rows' spread (1e60 against a standard deviation
        # of 1) must stay a large finite number, not become inf after the release was drawn
        numeric = np.clip(numeric, -FLOAT32_LIMIT, FLOAT32_LIMIT)
        categorical = np.zeros((len(frame), len(self.categorical)), dtype=np.int32)
        for i, (column, vocabulary) in enumerate(zip(self.categorical, self.vocabularies, strict=True)):
            lookup = {value: j + 1 for j, value in enumerate(vocabulary)}
            categorical[:, i] = frame[column].astype(str).map(lookup).fillna(0).to_numpy(dtype=np.int32)
        return numeric.astype(np.float32), categorical

    def to_dict(self) -> dict:
        return {"numeric": list(self.numeric), "categorical": list(self.categorical), "means": list(self.means),
                "stds": list(self.stds), "vocabularies": [list(v) for v in self.vocabularies]}

    @classmethod
    def from_dict(cls, data: dict) -> Preprocessor:
        return cls(tuple(data["numeric"]), tuple(data["categorical"]), tuple(data["means"]), tuple(data["stds"]),
                   tuple(tuple(v) for v in data["vocabularies"]))

    @classmethod
    def from_file(cls, data: Any, max_levels: int) -> Preprocessor:
        """From a model file, every field checked (ValueError or TypeError else): column names are strings, one
        mean and one standard deviation per numeric column, each a finite number (a string of a number is not one:
        it passed a float conversion and failed later), deviations positive, and each vocabulary at most
        ``max_levels`` distinct strings (padding one with duplicates made each categorical split list them)."""
        if not isinstance(data, dict) or set(data) != {"numeric", "categorical", "means", "stds", "vocabularies"}:
            raise ValueError("preprocessing fields")
        numeric, categorical = data["numeric"], data["categorical"]
        means, stds, vocabularies = data["means"], data["stds"], data["vocabularies"]
        lists = (numeric, categorical, means, stds, vocabularies)
        if not all(isinstance(x, list) for x in lists) or not all(isinstance(v, list) for v in vocabularies):
            raise TypeError("preprocessing lists")
        if not all(isinstance(n, str) for n in numeric + categorical) or len(means) != len(numeric) \
                or len(stds) != len(numeric) or len(vocabularies) != len(categorical):
            raise ValueError("preprocessing shapes")
        if not all(type(x) in (int, float) and math.isfinite(x) for x in means + stds) or any(x <= 0 for x in stds):
            raise ValueError("preprocessing numbers")
        for vocabulary in vocabularies:
            if len(vocabulary) > max_levels or not all(isinstance(x, str) for x in vocabulary) \
                    or len(set(vocabulary)) != len(vocabulary):
                raise ValueError("vocabularies")
        return cls.from_dict(data)


MAX_MAGNITUDE = 1e100  # a numeric feature's largest |value|: squares and sums of any table stay finite
FLOAT32_LIMIT = 1e30  # standardized values are clipped here: finite in float32, squares too


def _numeric(frame: pd.DataFrame, columns) -> np.ndarray:
    """The numeric columns as float64: every value a finite number of magnitude at most :data:`MAX_MAGNITUDE` —
    planning checks the whole table, so that standardizing any subset of its rows (after a release was drawn) is
    finite: an ``inf`` made the mean infinite and the trees' training fail after the charge."""
    if not columns:
        return np.zeros((len(frame), 0))
    values = frame[list(columns)].apply(pd.to_numeric, errors="coerce")
    bad = values.isna().any()
    if bad.any():
        raise LabelDPError(f"non-numeric or missing values in numeric column(s) {list(bad[bad].index)}",
                           code="malformed_file")
    array = values.to_numpy(dtype=np.float64)
    outside = ~(np.abs(array) <= MAX_MAGNITUDE).all(axis=0)
    if outside.any():
        raise LabelDPError(f"infinite values, or values beyond ±{MAX_MAGNITUDE:g}, in numeric column(s) "
                           f"{[c for c, o in zip(columns, outside, strict=True) if o]}", code="malformed_file")
    return array
