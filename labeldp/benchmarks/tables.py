"""A researcher's own CSV or Parquet table as a dataset of ``labeldp bench utility --data FILE --label COL``.

:class:`TableSource` reads the table, chooses the feature columns and the label kind (or checks the ones given),
and hands :mod:`labeldp.benchmarks.utility` a :class:`~labeldp.benchmarks.utility.Prepared` dataset like any
bundled one: the same protocol, mechanisms and outputs. Every problem with the table or the options is a
:class:`~shared.errors.LabelDPError` with one line that names the column, the bound or the file.

The rules (also in ``labeldp bench utility --help``):

* **Columns.** With ``--features``/``--categorical`` exactly those columns are used (either may be empty).
  Without them every other column is: numbers are numeric features; strings, booleans and categories are
  categorical. Never used: the label; id-like columns — named ``id``, ``*_id``, ``example_id``, ``rownames``,
  ``index`` or ``Unnamed: N``, strings distinct on every row, or integers that number the rows consecutively —
  and columns of any other type (dates).
* **Rows.** Rows whose label or a numeric feature is missing are dropped (their count is reported); a missing
  category is a category of its own.
* **Kind.** Integer-valued labels are ``integer``, other numbers ``continuous``; ``classes`` (any values, mapped
  to 0..K-1 in sorted order) and ``finite`` (the distinct values) only when asked for.
* **Bounds.** ``--clip LOW:HIGH`` is the labels service's declared clipping: the bench uploads the raw labels,
  the service clips and counts them; the test labels are scored after the same clip. Without it the bounds are
  the labels' own minimum and maximum — a data-dependent choice, fine for a benchmark, not for a release.
  ``--clip auto:Q_LOW:Q_HIGH:EPS[:LOW:HIGH]`` chooses them privately: the labels service's DP quantiles on the
  outer range LOW:HIGH (default: the labels' min and max), at ε = EPS (:mod:`labeldp.benchmarks.private_clip`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from labeldp.benchmarks.private_clip import PREFIX, AutoClip, parse_auto_clip
from shared.errors import ErrorCode, LabelDPError

KINDS = ("integer", "continuous", "finite", "classes")
LOSSES = ("squared", "poisson", "cross_entropy")
MIN_TEST_ROWS, MIN_TRAIN_ROWS = 10, 50
MAX_GRID = 10_000  # the labels service's grid_size limit
_ID_NAME = re.compile(r"^(id|example_id|rownames|row_names|index|unnamed: ?\d+)$|(^|[_\s.])id$", re.IGNORECASE)


def _usage(message: str) -> LabelDPError:
    return LabelDPError(message, code=ErrorCode.USAGE)


def parse_clip(text: str | None) -> tuple[float, float] | AutoClip | None:
    """``LOW:HIGH`` as two finite numbers with LOW < HIGH, or ``auto:…`` (:func:`parse_auto_clip`)."""
    if text is None:
        return None
    if text.startswith(PREFIX):
        return parse_auto_clip(text)
    parts = text.split(":")
    try:  # NaN: not two numbers
        low, high = (float(parts[0]), float(parts[1])) if len(parts) == 2 else (math.nan, math.nan)
    except ValueError:
        low = high = math.nan
    if not (math.isfinite(low) and math.isfinite(high)):
        raise _usage(f"--clip takes LOW:HIGH, two finite numbers (e.g. --clip 0:15000 or --clip -5:5), not {text!r}")
    if low >= high:
        raise _usage(f"--clip {text}: LOW must be below HIGH")
    return low, high


def parse_columns(text: str | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    return tuple(c.strip() for c in text.split(",") if c.strip())


def read_table(path: str | Path) -> pd.DataFrame:
    """A CSV (also .tsv, .txt, compressed) or Parquet file as a frame; one-line errors otherwise."""
    path = Path(path)
    if not path.exists():
        raise _usage(f"--data {path}: no such file")
    if path.is_dir():
        raise _usage(f"--data {path}: a directory, not a CSV or Parquet file")
    suffixes = [s.lower() for s in path.suffixes]
    compressed = suffixes[-1:] in (['.gz'], ['.bz2'], ['.zip'], ['.xz'], ['.zst'])
    suffix = suffixes[-2] if compressed and len(suffixes) > 1 else (suffixes[-1] if suffixes else "")
    try:
        if suffix in (".parquet", ".pq"):
            frame = pd.read_parquet(path)
        elif suffix in (".csv", ".tsv", ".txt", ".tab"):
            frame = pd.read_csv(path, sep="\t" if suffix in (".tsv", ".tab") else ",")
        else:
            raise _usage(f"--data {path}: unknown format {suffix or '(no suffix)'!r}; give a .csv or .parquet file")
    except LabelDPError:
        raise
    except pd.errors.EmptyDataError:
        raise _usage(f"--data {path}: the table is empty") from None
    except (ValueError, OSError, UnicodeDecodeError, pd.errors.ParserError) as err:
        what = "Parquet" if suffix in (".parquet", ".pq") else "CSV"
        first = (str(err).splitlines() or [type(err).__name__])[0][:160]
        raise _usage(f"--data {path}: cannot read it as {what}: {first}") from None
    if len(frame) == 0:
        raise _usage(f"--data {path}: the table has no rows")
    frame.columns = [str(c) for c in frame.columns]
    return frame


def id_reason(frame: pd.DataFrame, column: str) -> str | None:
    """Why ``column`` is an identifier, not a feature (None: it is not one): its name, distinct strings on every
    row, or integers that number the rows consecutively (0..n-1, 1..n, ...)."""
    if _ID_NAME.search(column.strip()):
        return "id-like name"
    values = frame[column]
    if _is_text(values) and values.nunique(dropna=False) == len(values) and len(values) > 1:
        return "id-like: a distinct string on every row"
    if pd.api.types.is_integer_dtype(values) and not pd.api.types.is_bool_dtype(values) and len(values) > 1:
        ordered = np.sort(values.to_numpy())
        if np.all(np.diff(ordered) == 1):
            return "id-like: integers numbering the rows"
    return None


def id_like(frame: pd.DataFrame, column: str) -> bool:
    return id_reason(frame, column) is not None


def _is_text(values: pd.Series) -> bool:
    return (pd.api.types.is_object_dtype(values) or pd.api.types.is_string_dtype(values)
            or isinstance(values.dtype, pd.CategoricalDtype) or pd.api.types.is_bool_dtype(values))


def infer_columns(frame: pd.DataFrame, label: str) -> tuple[tuple[str, ...], tuple[str, ...], dict[str, str]]:
    """(numeric, categorical, {left-out column: why}) under the rule of the module docstring."""
    numeric: list[str] = []
    categorical: list[str] = []
    ignored: dict[str, str] = {}
    for column in frame.columns:
        if column == label:
            continue
        values = frame[column]
        reason = id_reason(frame, column)
        if reason is not None:
            ignored[column] = reason
        elif _is_text(values):
            categorical.append(column)
        elif pd.api.types.is_numeric_dtype(values):
            numeric.append(column)
        else:
            ignored[column] = f"type {values.dtype} is neither a number nor a category"
    return tuple(numeric), tuple(categorical), ignored


def infer_kind(labels: np.ndarray) -> str:
    """``integer`` when every label is a whole number, else ``continuous``."""
    return "integer" if np.all(labels == np.round(labels)) else "continuous"


@dataclass(frozen=True)
class TableSource:
    """``--data FILE --label COL`` and the options that shape it (None: inferred)."""

    path: Path
    label: str
    numeric: tuple[str, ...] | None = None
    categorical: tuple[str, ...] | None = None
    kind: str | None = None
    clip: tuple[float, float] | AutoClip | None = None
    grid: int | None = None
    loss: str | None = None
    test_fraction: float = 0.2

    @property
    def name(self) -> str:
        """The dataset and features-table name: the file's stem in the services' name alphabet."""
        stem = self.path.name.split(".")[0]
        return re.sub(r"[^A-Za-z0-9_-]+", "-", stem).strip("-_")[:100] or "table"

    def check_options(self) -> None:
        """What can be refused before the table is read."""
        if self.kind is not None and self.kind not in KINDS:
            raise _usage(f"--kind {self.kind!r}: choose one of {', '.join(KINDS)}")
        if self.loss is not None and self.loss not in LOSSES:
            raise _usage(f"--loss {self.loss!r}: choose one of {', '.join(LOSSES)}")
        if not (0 < self.test_fraction < 1):
            raise _usage(f"--test-fraction {self.test_fraction:g}: must be between 0 and 1 (exclusive)")
        if self.grid is not None and not (2 <= self.grid <= MAX_GRID):
            raise _usage(f"--grid {self.grid}: must be between 2 and {MAX_GRID}")
        if self.kind in ("finite", "classes"):
            for flag, value in (("--clip", self.clip), ("--grid", self.grid)):
                if value is not None:
                    raise _usage(f"{flag} applies to integer and continuous labels, not --kind {self.kind}")
        if self.kind in ("integer", "continuous") and self.loss == "cross_entropy":
            raise _usage(f"--loss cross_entropy is for class labels: use --kind classes (or finite), "
                         f"not --kind {self.kind}")
        if self.kind == "classes" and self.loss not in (None, "cross_entropy"):
            raise _usage(f"--kind classes trains with cross_entropy, not --loss {self.loss}")

    def prepare(self):
        """The table as a :class:`~labeldp.benchmarks.utility.Prepared` dataset."""
        from labeldp.benchmarks.utility import Prepared

        self.check_options()
        frame = read_table(self.path)
        where = f"--data {self.path.name}"
        if self.label not in frame.columns:
            raise _usage(f"{where}: no label column {self.label!r}; columns: {_names(frame.columns)}")
        numeric, categorical, ignored = self._columns(frame, where)
        kind, loss = self._kind_and_loss(frame[self.label])
        classification = loss == "cross_entropy"
        # rows: a missing label or numeric feature drops the row; categories keep "nan" as a value
        if classification:
            keep = frame[self.label].notna()
        else:
            keep = pd.to_numeric(frame[self.label], errors="coerce").notna()
        for column in numeric:
            keep &= pd.to_numeric(frame[column], errors="coerce").notna()
        dropped = int((~keep).sum())
        frame = frame[keep.to_numpy()].reset_index(drop=True)
        if len(frame) == 0:
            raise _usage(f"{where}: no row has a label{' and every numeric feature' if numeric else ''}")
        n_test = int(math.floor(len(frame) * self.test_fraction + 1e-9))
        if n_test < MIN_TEST_ROWS or len(frame) - n_test < MIN_TRAIN_ROWS:
            raise _usage(f"{where}: {len(frame)} usable rows at --test-fraction {self.test_fraction:g} give "
                         f"{len(frame) - n_test} training and {n_test} test rows; the bench needs at least "
                         f"{MIN_TRAIN_ROWS} and {MIN_TEST_ROWS}")
        for column in categorical:
            frame[column] = frame[column].astype(str)
        notes = [f"Table `{self.path.name}`: {len(frame) + dropped} rows"
                 + (f", {dropped} dropped (missing label or numeric feature)" if dropped else "")
                 + f"; label `{self.label}`; numeric features {_listing(numeric)}; categorical "
                 f"{_listing(categorical)}" + (f"; not used: {_reasons(ignored)}" if ignored else "") + "."]
        if classification:
            return self._classes(frame, kind, numeric, categorical, notes, dropped)
        labels = pd.to_numeric(frame[self.label], errors="coerce").to_numpy(dtype=float)
        if kind == "finite":
            values = np.unique(labels)
            domain = {"label_kind": "finite", "values": [float(v) for v in values]}
            truth = labels
            notes.append(f"Finite labels: the {values.size} distinct values of the table (a data-dependent choice: "
                         "fine for a benchmark, not for a release).")
        else:
            domain, truth = self._bounded(labels, kind, notes)
        description = f"`{self.label}` of {self.path.name} ({kind} labels, {loss} loss)"
        return Prepared.build(self.name, description, frame, labels, truth, numeric, categorical, loss, domain,
                              test_fraction=self.test_fraction, notes=tuple(notes),
                              info={"source": str(self.path), "label": self.label, "kind": kind,
                                    "dropped_rows": dropped, "ignored_columns": ignored},
                              clip_choice=self.clip if isinstance(self.clip, AutoClip) else None)

    def _columns(self, frame: pd.DataFrame, where: str):
        if self.numeric is None and self.categorical is None:
            numeric, categorical, ignored = infer_columns(frame, self.label)
        else:
            numeric, categorical = self.numeric or (), self.categorical or ()
            given = numeric + categorical
            missing = [c for c in given if c not in frame.columns]
            if missing:
                raise _usage(f"{where}: no feature column(s) {', '.join(map(repr, missing))}; columns: "
                             f"{_names(frame.columns)}")
            if self.label in given:
                raise _usage(f"{where}: the label column {self.label!r} cannot also be a feature")
            if "example_id" in given:
                raise _usage(f"{where}: example_id is the bench's key, not a feature; rename the column")
            twice = sorted(set(numeric) & set(categorical))
            if twice:
                raise _usage(f"{where}: column(s) {', '.join(map(repr, twice))} given as numeric and categorical")
            text = [c for c in numeric if not pd.api.types.is_numeric_dtype(frame[c])
                    or pd.api.types.is_bool_dtype(frame[c])]
            if text:
                raise _usage(f"{where}: feature column(s) {', '.join(map(repr, text))} are not numeric; "
                             "list them under --categorical")
            ignored = {c: "not in --features/--categorical" for c in frame.columns
                       if c not in given and c != self.label}
        if not numeric and not categorical:
            raise _usage(f"{where}: no feature columns to train on (besides the label {self.label!r}); "
                         "name them with --features/--categorical")
        return tuple(numeric), tuple(categorical), ignored

    def _kind_and_loss(self, column: pd.Series) -> tuple[str, str]:
        kind, loss = self.kind, self.loss
        if kind == "classes" or (kind == "finite" and loss == "cross_entropy"):
            return kind, "cross_entropy"
        if pd.api.types.is_bool_dtype(column):
            column = column.astype(float)
        values = pd.to_numeric(column, errors="coerce")
        bad = column[values.isna() & column.notna()]
        if len(bad) or not pd.api.types.is_numeric_dtype(values):
            example = f" (e.g. {bad.iloc[0]!r})" if len(bad) else ""
            raise _usage(f"label column {self.label!r} is not numeric{example}: for class labels pass --kind classes")
        present = values.dropna().to_numpy(dtype=float)
        if present.size == 0:
            raise _usage(f"label column {self.label!r} has no values")
        if not np.all(np.isfinite(present)):
            raise _usage(f"label column {self.label!r} has infinite values")
        if kind is None:
            kind = infer_kind(present)
        elif kind == "integer" and infer_kind(present) != "integer":
            example = present[present != np.round(present)][0]
            raise _usage(f"--kind integer: label column {self.label!r} has non-integer values (e.g. {example:g}); "
                         "use --kind continuous")
        if loss is None:
            loss = "squared"
        if loss == "poisson":
            bounds = self._declared_bounds
            low = bounds[0] if bounds else present.min()
            if low < 0:
                raise _usage(f"--loss poisson needs labels ≥ 0; the lowest {'clip bound' if bounds else 'label'} "
                             f"is {low:g}")
        return kind, loss

    @property
    def _declared_bounds(self) -> tuple[float, float] | None:
        """The bounds given on the command line: ``--clip LOW:HIGH``, or the outer range of ``--clip auto``."""
        return self.clip.outer if isinstance(self.clip, AutoClip) else self.clip

    def _bounded(self, labels: np.ndarray, kind: str, notes: list[str]) -> tuple[dict, np.ndarray]:
        """The dataset's clip fields and the labels as scored (clipped the same way); with ``--clip auto``, the
        outer range's (the clip itself is chosen once the services run: :mod:`labeldp.benchmarks.private_clip`)."""
        bounds = self._declared_bounds
        if bounds is not None:
            low, high = bounds
            if kind == "integer" and (low != round(low) or high != round(high)):
                raise _usage(f"--clip {low:g}:{high:g}: integer labels need integer bounds")
            if isinstance(self.clip, AutoClip):
                notes.append(f"Outer range [{low:g}, {high:g}] declared (`--clip auto`): where the quantiles are "
                             "chosen from.")
            else:
                notes.append(f"Declared clipping [{low:g}, {high:g}] (`--clip`): the bench uploads the raw labels "
                             "and the labels service clips them (counts below); the test labels are scored after the "
                             "same clip.")
        else:
            low, high = float(labels.min()), float(labels.max())
            if low == high:
                raise _usage(f"label column {self.label!r} has a single value ({low:g}): nothing to learn")
            what = "The outer range [{}, {}] is" if isinstance(self.clip, AutoClip) else "Bounds [{}, {}] are"
            notes.append(what.format(f"{low:g}", f"{high:g}") + " the labels' own minimum and maximum: a "
                         "data-dependent choice, fine for a benchmark, not for a release (declare public bounds with "
                         "--clip).")
        if kind == "integer":
            low, high = int(low), int(high)
        domain: dict[str, Any] = {"label_kind": kind, "clip": {"low": low, "high": high}}
        if self.grid is not None:
            domain["grid_size"] = self.grid
            over = "the chosen clip" if isinstance(self.clip, AutoClip) else f"[{low:g}, {high:g}]"
            notes.append(f"Released on a grid of {self.grid} points over {over} (`--grid`): each label "
                         "is moved to a neighbouring grid point by unbiased randomized rounding; test labels are "
                         "scored unrounded.")
        elif kind == "continuous":
            domain["grid_size"] = 101
            notes.append("Continuous labels on the service's default grid of 101 points (`--grid` to change).")
        return domain, np.clip(labels, low, high)

    def _classes(self, frame: pd.DataFrame, kind: str, numeric, categorical, notes: list[str], dropped: int):
        from labeldp.benchmarks.utility import Prepared

        column = frame[self.label]
        numbers = pd.to_numeric(column, errors="coerce")
        values = np.unique(numbers.to_numpy(dtype=float)) if numbers.notna().all() else np.unique(column.astype(str))
        if values.size < 2:
            raise _usage(f"label column {self.label!r} has a single class: nothing to learn")
        source = numbers.to_numpy(dtype=float) if numbers.notna().all() else column.astype(str).to_numpy()
        classes = np.searchsorted(values, source).astype(float)
        shown = ", ".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v:g}" for k, v in enumerate(values[:12]))
        notes.append(f"{values.size} classes (the distinct labels, sorted; a data-dependent list): {shown}"
                     f"{', …' if values.size > 12 else ''}. Metric: test accuracy.")
        domain = {"label_kind": "classes", "num_classes": int(values.size)}
        description = f"`{self.label}` of {self.path.name} ({values.size} classes, cross-entropy)"
        return Prepared.build(self.name, description, frame, classes, classes, numeric, categorical,
                              "cross_entropy", domain, test_fraction=self.test_fraction, notes=tuple(notes),
                              info={"source": str(self.path), "label": self.label, "kind": kind,
                                    "dropped_rows": dropped, "classes": [str(v) for v in values]})


def _names(columns) -> str:
    columns = list(columns)
    return ", ".join(columns[:20]) + (f", … ({len(columns)} in all)" if len(columns) > 20 else "")


def _listing(columns) -> str:
    return ", ".join(f"`{c}`" for c in columns) if columns else "none"


def _reasons(ignored: dict[str, str]) -> str:
    return ", ".join(f"`{c}` ({why})" for c, why in ignored.items())
