"""What a label mechanism is, as the services see it: a small immutable object with its exact distribution, a
vectorized ``sample`` from a generator, the ε certified from the probabilities it actually samples, its
``dp_event()`` for the accountant and a JSON description (the mechanism document). Every randomizer of
:mod:`shared.mechanisms` is one; solvers return them and services never look inside.

Utility numbers (bias, the expected loss of noisy labels) exist for randomizers of one label value;
:class:`LabelRandomizer` adds them (subset selection, which releases a set of classes, has none).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np
from dp_accounting import dp_event


@runtime_checkable
class Mechanism(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def epsilon(self) -> float: ...

    @property
    def certified_epsilon(self) -> float: ...

    @property
    def num_outputs(self) -> int | None: ...

    def sample(self, labels: Any, rng: np.random.Generator) -> np.ndarray: ...

    def dp_event(self) -> dp_event.DpEvent: ...

    def describe(self) -> dict[str, Any]: ...


@runtime_checkable
class LabelRandomizer(Mechanism, Protocol):
    @property
    def max_abs_bias(self) -> float: ...

    def noisy_label_loss(self, prior: Any) -> float: ...


def uninformative_reason(mechanism: Mechanism) -> str | None:
    """Why ``mechanism``'s output says nothing about the label, or None when it does. Its certified ε is the exact
    max log-ratio of the probabilities it samples, so it is 0 exactly when every label has the same output
    distribution (one possible output, or identical rows): a release of it would be charged for noise alone."""
    if mechanism.certified_epsilon > 0.0:
        return None
    if mechanism.num_outputs == 1:
        return f"{mechanism.name} has a single possible output: every label would be released as the same value"
    return f"{mechanism.name} draws every label's output from the same distribution (its certified epsilon is 0)"
