"""A release's sampler rebuilt from its mechanism document, so that a job can store the document's address instead of
a pickled object and still draw exactly what the release described.

:func:`sampler_from_description` takes a mechanism description — ``describe()`` of the mechanism, or a release's
(:meth:`labels_party.core.pipeline.Plan.describe`, which adds the budget split and any fallback) — and returns the
mechanism that draws one number per label, rebuilt exactly: the same integer probabilities, so the same draws from
the same generator. Which class reads it follows from the fields only that class describes (its *shape*), not from
a field added for the purpose: documents stored before this module existed rebuild too, and every document keeps
its content address.
"""

from __future__ import annotations

from typing import Any

from shared import described
from shared.errors import ErrorCode, LabelDPError
from shared.mechanisms.additive import AdditiveNoiseRandomizer
from shared.mechanisms.finite import FiniteRandomizer
from shared.mechanisms.randomized_response import RandomizedResponse, TopKRandomizedResponse

Sampler = FiniteRandomizer | RandomizedResponse | TopKRandomizedResponse | AdditiveNoiseRandomizer

# The field only one kind of one-number-per-label mechanism describes (RR-Top-k is RR with "candidates").
COUNTS, KEEP, LATTICE = "matrix_counts_over_2_53", "keep_count_over_2_53", "lattice"


def sampler_from_description(description: dict) -> Sampler:
    """The mechanism a description states, rebuilt exactly (see the module). A finite randomizer on a continuous
    domain (``RoundedRandomizer``, whose description adds its ``rounding`` domain) rebuilds to its inner randomizer
    on the grid — what :attr:`labels_party.core.pipeline.Plan.sampler` draws from, the labels having been rounded when
    the histogram was taken.

    Refuses with ``mechanism_not_supported_on_spark`` what does not release one number per label (subset selection,
    ALIBI, a group release, anything else described), and with ``invalid_mechanism_document`` a description that is not
    an object, states more than one kind of mechanism, a finite randomizer without its probabilities, or anything
    its class refuses (see each class's ``from_description``)."""
    if not isinstance(description, dict):
        raise described.invalid(f"a description is a JSON object, not {type(description).__name__}")
    name = description.get("mechanism")
    if "p_true" in description:
        raise _not_one_number_per_label(name, "subset selection releases a set of classes per label")
    if "num_classes" in description and "noise" in description:
        raise _not_one_number_per_label(name, "ALIBI releases a vector of noisy class scores per label")
    if "groups" in description:
        raise _not_one_number_per_label(name, "a group release has one randomizer per group")
    shapes = [key for key in (COUNTS, KEEP, LATTICE) if key in description]
    if len(shapes) > 1:
        raise described.invalid(f"the description states more than one kind of mechanism ({', '.join(shapes)})")
    if shapes == [COUNTS]:
        return FiniteRandomizer.from_description(description)
    if shapes == [KEEP]:
        if "candidates" in description:
            return TopKRandomizedResponse.from_description(description)
        return RandomizedResponse.from_description(description)
    if shapes == [LATTICE]:
        return AdditiveNoiseRandomizer.from_description(description)
    if "input_values" in description:  # describe(include_matrix=False): a summary, not the distribution
        raise described.invalid(f"{name!r} is described without its probabilities ({COUNTS!r} or {KEEP!r})")
    raise _not_one_number_per_label(name, "its description states no mechanism that draws one number per label")


def _not_one_number_per_label(name: Any, why: str) -> LabelDPError:
    return LabelDPError(f"mechanism {name!r} cannot be released on Spark: {why}; Spark releases write one number "
                        "per label", code=ErrorCode.MECHANISM_NOT_SUPPORTED_ON_SPARK)
