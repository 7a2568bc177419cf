"""How a job's model turns its learner's raw predictions into the job's predictions, saved in the model file beside
the learner's own (the MLP's header, the trees' ``labeldp`` attribute) and applied by the trainer and by
``labeldp predict`` alike.

* ``model``: the learner's predictions as they are.
* ``shrunk``: toward a constant c, by a weight w chosen on unbiased validation labels (auto jobs; fixed jobs on an
  unbiased mechanism's numeric labels, :mod:`features_party.learn.shrinkage`) — for the squared loss
  c + w·(f − m), m the mean prediction on the training rows (w < 1 shrinks a model that fitted noise; w > 1
  stretches one trained on labels a biased mechanism pulled toward the prior); for the Poisson loss the same on the
  log scale, c·exp(w·(log f − m)).
* ``constant``: c for every example — the mean, or the majority class (its probabilities one-hot).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from shared.errors import ErrorCode, LabelDPError

KINDS = ("model", "shrunk", "constant")
LIMIT = 1e15  # a saved constant's or center's magnitude: a label's (shared.domains.LABEL_VALUE_LIMIT)
MAX_WEIGHT = 2.0  # the largest shrinkage weight a job uses (features_party.auto.WEIGHTS)


@dataclass(frozen=True)
class Output:
    kind: str = "model"
    constant: float = 0.0  # the mean (a rate for Poisson), or the class
    center: float = 0.0  # m: the mean prediction (of log f for Poisson) on the training rows
    weight: float = 1.0
    log_scale: bool = False  # Poisson: shrink log rates
    num_classes: int | None = None  # classes: the constant class's one-hot width

    def apply(self, raw: np.ndarray) -> np.ndarray:
        raw = np.asarray(raw, dtype=np.float64)
        if self.kind == "model":
            return raw
        n = raw.shape[0]
        if self.kind == "constant":
            if self.num_classes is not None:
                probabilities = np.zeros((n, self.num_classes))
                probabilities[:, int(self.constant)] = 1.0
                return probabilities
            return np.full(n, self.constant)
        if self.log_scale:
            log_rate = np.log(np.maximum(raw, 1e-300))
            return self.constant * np.exp(np.clip(self.weight * (log_rate - self.center), -700, 700))
        return self.constant + self.weight * (raw - self.center)

    def describe(self) -> dict:
        return {key: value for key, value in asdict(self).items() if value is not None}

    @classmethod
    def from_dict(cls, data: Any, outputs: int) -> Output:
        """From a model file whose model has ``outputs`` outputs per row (1, or K class probabilities): every field
        checked (a damaged file is one ``malformed_file`` line)."""
        if data is None:
            return cls()
        if not isinstance(data, dict) or set(data) - {f for f in cls.__dataclass_fields__}:
            raise _malformed("its output map is not an object of known fields")
        kind = data.get("kind", "model")
        if kind not in KINDS:
            raise _malformed(f"its output kind is not one of {', '.join(KINDS)}")
        numbers = {}
        for name in ("constant", "center", "weight"):
            value = data.get(name, getattr(cls, name))
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
                    or abs(value) > LIMIT:
                raise _malformed(f"its output {name} is not a finite number")
            numbers[name] = float(value)
        if not 0 <= numbers["weight"] <= MAX_WEIGHT:
            raise _malformed(f"its output weight is not between 0 and {MAX_WEIGHT:g}")
        log_scale, classes = data.get("log_scale", False), data.get("num_classes")
        if not isinstance(log_scale, bool) or (log_scale and not numbers["constant"] > 0):
            raise _malformed("its output log_scale is not true or false, or its rate not positive")
        if (classes is None) != (outputs == 1) or (classes is not None and classes != outputs):
            raise _malformed("its output's classes are not its model's")
        if classes is not None and (not 0 <= numbers["constant"] < classes
                                    or numbers["constant"] != int(numbers["constant"])):
            raise _malformed("its output class is not one of its classes")
        return cls(kind, **numbers, log_scale=log_scale, num_classes=classes)


def _malformed(what: str) -> LabelDPError:
    return LabelDPError(f"the model file is damaged: {what}", code=ErrorCode.MALFORMED_FILE)


def predictions_table(ids: np.ndarray, predicted: np.ndarray, holdout: np.ndarray) -> pa.Table:
    """A job's predictions file's rows: ``example_id``, ``prediction`` (for a class model: the class, with its
    ``p_class_k`` probabilities) and ``holdout`` (the rows its split held out)."""
    columns = {"example_id": pa.array(np.asarray(ids).astype(str))}
    if predicted.ndim == 2:
        columns["prediction"] = pa.array(predicted.argmax(axis=1))
        columns.update({f"p_class_{k}": pa.array(predicted[:, k]) for k in range(predicted.shape[1])})
    else:
        columns["prediction"] = pa.array(predicted)
    columns["holdout"] = pa.array(np.asarray(holdout, dtype=bool))
    return pa.table(columns)
