"""``labeldp bench utility --clip auto:Q_LOW:Q_HIGH:EPS[:LOW:HIGH]``: the clip bounds chosen privately, by the
labels service's DP quantiles (:mod:`labels_party.core.quantiles`), as a data owner would.

The clip is a dataset's declared preprocessing, applied when its labels are uploaded, so it must be known before
the dataset the releases come from exists. The flow is therefore two datasets of the same examples:

1. **outer** — ``<name>-outer``, declared on the public outer range [LOW, HIGH] (the same kind and grid), with a
   budget of exactly EPS; the owner uploads the raw labels and asks for the Q_LOW and Q_HIGH quantiles at EPS
   (split evenly between the two: basic composition), each by a sweep of a logarithmic grid of candidates that
   stops at the first whose noisy count reaches the noisy target rank (``candidates: "log"``, ``method:
   "above-threshold"``, :mod:`labels_party.core.quantiles`): on heavy-tailed labels the exponential mechanism over the
   declared range's evenly spaced values put a 0.99 quantile of household wealth at 1310 against a true 224.6; the
   sweep lands within a factor of two. Every example is charged EPS there.
2. **release** — ``<name>``, declared with clip [v_low, v_high] from those values; the owner uploads the same raw
   labels (the service clips them), and every run releases from it as with a fixed ``--clip``.

Each example's privacy cost is therefore EPS + what the runs spend on it: the summary states both, and the
``datasets.json`` entry the outer dataset and its ledger's spend. Without LOW:HIGH the outer range is the labels'
own minimum and maximum — a data-dependent choice, fine for a benchmark (and said so in the summary), not for a
release, where the outer range must be public (a price list's, a legal maximum).

The two draws are independent, so v_low ≤ v_high is not guaranteed: the values are sorted, and equal ones
widened to the next value of the outer domain (post-processing of the DP output, free).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np

from shared.errors import ErrorCode, LabelDPError

PREFIX = "auto:"


@dataclass(frozen=True)
class AutoClip:
    """The ``--clip auto:…`` request: two quantiles, the ε they cost, the outer range (None: the labels')."""

    low_quantile: float
    high_quantile: float
    epsilon: float
    outer: tuple[float, float] | None = None

    def describe(self) -> dict:
        return {"quantiles": [self.low_quantile, self.high_quantile], "epsilon": self.epsilon,
                "outer": list(self.outer) if self.outer is not None else None}


@dataclass(frozen=True)
class ChosenClip:
    """What the labels service answered: the clip, and what it cost."""

    request: AutoClip
    outer: tuple[float, float]
    values: tuple[float, float]  # the DP quantiles as released
    clip: tuple[float, float]  # sorted (and widened if equal)
    outer_dataset_id: str
    release_id: str
    epsilon_spent: float  # the outer dataset's ledger, per example

    def describe(self) -> dict:
        return {**self.request.describe(), "outer": list(self.outer), "values": list(self.values),
                "clip": list(self.clip), "outer_dataset_id": self.outer_dataset_id, "release_id": self.release_id,
                "epsilon_spent": self.epsilon_spent}


def _usage(message: str) -> LabelDPError:
    return LabelDPError(message, code=ErrorCode.USAGE)


def parse_auto_clip(text: str) -> AutoClip:
    """``auto:Q_LOW:Q_HIGH:EPS`` or ``auto:Q_LOW:Q_HIGH:EPS:LOW:HIGH`` (negative bounds need no ``=``)."""
    parts = text[len(PREFIX):].split(":")
    form = "--clip auto:Q_LOW:Q_HIGH:EPS[:LOW:HIGH] (e.g. auto:0.01:0.99:0.1 or auto:0.01:0.99:0.1:0:20000)"
    try:
        numbers = [float(p) for p in parts]
    except ValueError:
        raise _usage(f"{form}, not {text!r}") from None
    if len(numbers) not in (3, 5) or not all(math.isfinite(n) for n in numbers):
        raise _usage(f"{form}, not {text!r}")
    low_q, high_q, epsilon = numbers[:3]
    if not 0 < low_q < high_q < 1:
        raise _usage(f"--clip {text}: the quantiles must satisfy 0 < Q_LOW < Q_HIGH < 1")
    if epsilon <= 0:
        raise _usage(f"--clip {text}: EPS must be positive")
    outer = None
    if len(numbers) == 5:
        if numbers[3] >= numbers[4]:
            raise _usage(f"--clip {text}: LOW must be below HIGH")
        outer = (numbers[3], numbers[4])
    return AutoClip(low_q, high_q, epsilon, outer)


def clip_from_quantiles(values: tuple[float, float], candidates: np.ndarray) -> tuple[float, float]:
    """The two values sorted; equal ones widened to the next candidate (the one below at the top)."""
    low, high = sorted(values)
    if low == high:
        at = int(np.searchsorted(candidates, low))
        if at + 1 < candidates.size:
            high = float(candidates[at + 1])
        else:
            low = float(candidates[at - 1])
    return float(low), float(high)


def request_clip(parties, name: str, domain: dict, example_ids, raw: np.ndarray, request: AutoClip,
                 candidates: np.ndarray) -> ChosenClip:
    """Step 1 of the module docstring for the dataset ``name`` (``domain``: its creation fields on the outer
    range; ``candidates``: that domain's values): the outer dataset, its raw labels and the owner's DP quantiles."""
    from features_party.client import LabelDPWarning, LabelsPartyError, quantile_values

    outer = (domain["clip"]["low"], domain["clip"]["high"])
    with parties.owner() as owner:
        try:
            dataset = owner.create_dataset(name=f"{name}-outer", epsilon_total=request.epsilon, **domain)
            with warnings.catch_warnings():  # a wide outer range is why the clip is chosen: not news here
                warnings.simplefilter("ignore", LabelDPWarning)
                owner.upload_labels(dataset.id, example_ids, raw)
            release = owner.request_quantiles(dataset.id, [request.low_quantile, request.high_quantile],
                                              request.epsilon, candidates="log", method="above-threshold",
                                              idempotency_key=f"clip-{name}")
        except LabelsPartyError as err:
            raise _usage(f"the labels service refused the private clip of {name}: {err.message}") from None
        spent = owner.budget(dataset.id).epsilon_spent
    found = quantile_values(release)
    values = (found[request.low_quantile], found[request.high_quantile])
    low, high = clip_from_quantiles(values, candidates)
    if domain["label_kind"] == "integer":
        low, high = int(low), int(high)
    return ChosenClip(request, outer, values, (low, high), dataset.id, release.id, spent)


def note(chosen: ChosenClip, name: str) -> str:
    """The summary's sentence on where the clip came from and what it cost."""
    request, (low, high), outer = chosen.request, chosen.clip, chosen.outer
    source = ("declared" if request.outer else
              "the labels' own min and max: a data-dependent choice, fine for a benchmark, not for a release")
    return (f"Clip [{low:g}, {high:g}] chosen privately (`--clip auto`): the labels service's DP quantiles "
            f"{request.low_quantile:g} and {request.high_quantile:g} (a sweep of a log grid, the sparse vector "
            "technique: `candidates: log`, `method: above-threshold`) of the uploaded labels on the outer range "
            f"[{outer[0]:g}, {outer[1]:g}] ({source}), ε = {request.epsilon:g} charged to every example on dataset "
            f"{name}-outer (its ledger: {chosen.epsilon_spent:g} spent).")
