"""What a learner fits, from a downloaded release: labels, the subset randomizer's unbiased weights, or ALIBI's
per-class log-likelihoods of its noisy vectors (the ``alibi`` loss makes them soft labels)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from shared import schemas
from shared.mechanisms.alibi import AlibiRandomizer
from shared.mechanisms.subset import SubsetSelectionRandomizer


def training_targets(table: pa.Table, release: schemas.Release) -> np.ndarray:
    """The release's targets in its rows' order: a vector of labels, or an (n, K) matrix for label sets and ALIBI."""
    names = table.schema.names
    if "label" in names:
        return table.column("label").to_numpy()
    columns = np.stack([table.column(n).to_numpy(zero_copy_only=False) for n in names if n.startswith("in_class_")],
                       axis=1)
    if release.mechanism == "alibi":
        return AlibiRandomizer.from_description(release.description).log_likelihoods(columns)
    return SubsetSelectionRandomizer.from_description(release.description).unbiased_weights(columns)
