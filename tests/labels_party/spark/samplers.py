"""Samplers the Spark tests ship to the Python workers (module level, so they pickle; the conftest registers this
module to be pickled by value, so the workers need not import the tests package)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from pyspark import TaskContext


class FailsOnceAfterTheFirstBatch:
    """Delegates to ``inner``; in attempt 0 of partition 0 it raises on the second batch, after the first batch's
    released values went to the writer — a task killed mid-partition. Every call in a task leaves a marker file
    ``<partition>-<attempt>-<batch>`` in ``markers`` (the driver's probe, outside any task, leaves none)."""

    def __init__(self, inner, markers: Path):
        self.inner, self.markers, self.batches = inner, str(markers), 0

    def sample(self, labels, rng):
        task = TaskContext.get()
        if task is not None:
            Path(self.markers, f"{task.partitionId()}-{task.attemptNumber()}-{self.batches}").touch()
            self.batches += 1
            if task.partitionId() == 0 and task.attemptNumber() == 0 and self.batches == 2:
                raise RuntimeError("killed after the first batch")
        return self.inner.sample(labels, rng)


class MisalignedOutputs:
    """A wrong sampler: right outputs, each batch's rotated by one row (a misalignment of labels and released
    values; the output marginal is unchanged, each label's conditional distribution is not)."""

    def __init__(self, inner):
        self.inner = inner

    def sample(self, labels, rng):
        return np.roll(self.inner.sample(labels, rng), 1)


class SetsInTasksOnly:
    """One number per label on the driver (so the driver's probe passes), a row of two per label in a task: the
    workers' own check must refuse it."""

    def __init__(self, inner):
        self.inner = inner

    def sample(self, labels, rng):
        released = self.inner.sample(labels, rng)
        return released if TaskContext.get() is None else np.column_stack([released, released])
