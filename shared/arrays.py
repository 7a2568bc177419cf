"""Small array helpers the immutable value objects of ``shared`` share."""

from __future__ import annotations

import numpy as np


def readonly(values, dtype) -> np.ndarray:
    """A contiguous copy that cannot be written: mechanism and domain objects are values, not buffers."""
    array = np.array(values, dtype=dtype, copy=True)
    array.setflags(write=False)
    return array


def number(value) -> str:
    """A number as a user reads it in a message (``15002`` or ``0.25``, never ``np.float64(15002.0)``)."""
    value = float(value)
    return str(int(value)) if value.is_integer() and abs(value) < 1e16 else repr(value)
