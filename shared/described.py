"""Reading a described object back: the typed fields of a mechanism document (a ``describe()`` output, possibly
through JSON), each checked, or the refusal ``invalid_mechanism_document`` saying what is wrong.

A stored document is rebuilt into the sampler a release runs, so nothing here may guess: a missing field is a
refusal, not a KeyError; ``true`` is not the count 1 and ``1.5`` is not truncated to it (numpy would do both);
an integer label value must be the float it stands for. Numbers keep their JSON type (an int stays an int), so a
rebuilt object describes itself with the same canonical JSON — the same document address.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from shared.errors import InvalidMechanismDocument


def invalid(what: str) -> InvalidMechanismDocument:
    return InvalidMechanismDocument(f"invalid mechanism document: {what}")


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_finite(value: int | float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int beyond the float range
        return False


def entry(description: Any, key: str) -> Any:
    if not isinstance(description, dict):
        raise invalid(f"expected a JSON object, got {type(description).__name__}")
    if key not in description:
        raise invalid(f"{key!r} is missing")
    return description[key]


def text(description: dict, key: str) -> str:
    value = entry(description, key)
    if not isinstance(value, str) or not value:
        raise invalid(f"{key!r} must be a non-empty string")
    return value


def flag(description: dict, key: str) -> bool:
    value = entry(description, key)
    if not isinstance(value, bool):
        raise invalid(f"{key!r} must be true or false")
    return value


def integer(description: dict, key: str, low: int | None = None, high: int | None = None) -> int:
    """An integer (never a bool or a float of integer value) in [low, high]."""
    value = entry(description, key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise invalid(f"{key!r} must be an integer, got {value!r}")
    if (low is not None and value < low) or (high is not None and value > high):
        raise invalid(f"{key!r} is {value}, outside [{low}, {high}]")
    return value


def real(description: dict, key: str, *, positive: bool = False) -> float:
    """A finite number, returned as it is (an int stays an int: the rebuilt description is the same JSON)."""
    value = entry(description, key)
    if not _is_number(value) or not _is_finite(value) or (positive and not value > 0):
        raise invalid(f"{key!r} must be a finite{' positive' if positive else ''} number, got {value!r}")
    return value


def mapping(description: dict, key: str) -> dict:
    """A JSON object, copied (the rebuilt object must not share anything the caller can still change)."""
    value = entry(description, key)
    if not isinstance(value, dict):
        raise invalid(f"{key!r} must be a JSON object")
    return copy.deepcopy(value)


def real_vector(description: dict, key: str) -> np.ndarray:
    """A non-empty list of finite numbers as float64, each exactly the number written (an integer beyond 2**53
    would become another number)."""
    values = entry(description, key)
    if not isinstance(values, list) or not values or not all(_is_number(v) for v in values):
        raise invalid(f"{key!r} must be a non-empty list of numbers")
    try:
        array = np.array(values, dtype=np.float64)
    except OverflowError:
        raise invalid(f"{key!r} has a number beyond the float range") from None
    if not np.all(np.isfinite(array)) or array.tolist() != values:
        raise invalid(f"{key!r} has a number that is not finite or not exact as a float")
    return array


def integer_vector(description: dict, key: str) -> np.ndarray:
    """A non-empty list of integers as int64."""
    values = entry(description, key)
    if not isinstance(values, list) or not values or set(map(type, values)) != {int}:
        raise invalid(f"{key!r} must be a non-empty list of integers")
    try:
        return np.array(values, dtype=np.int64)
    except OverflowError:
        raise invalid(f"{key!r} has an integer beyond 64 bits") from None


def integer_matrix(description: dict, key: str) -> np.ndarray:
    """A non-empty rectangular list of lists of integers as an int64 matrix. The type check runs row by row in C
    (``map(type, row)``): a few million entries take ~0.1 s, no Python loop over them."""
    rows = entry(description, key)
    if not isinstance(rows, list) or not rows or not all(isinstance(row, list) and row for row in rows):
        raise invalid(f"{key!r} must be a non-empty list of non-empty rows")
    if any(set(map(type, row)) != {int} for row in rows):
        raise invalid(f"{key!r} must hold integers only")
    try:
        return np.array(rows, dtype=np.int64)
    except ValueError:  # rows of different lengths
        raise invalid(f"{key!r} must be rectangular (every row as long as the first)") from None
    except OverflowError:
        raise invalid(f"{key!r} has an integer beyond 64 bits") from None


def ratio(description: dict, key: str, limit: int) -> tuple[int, int]:
    """``"a/b"`` with positive integers a, b <= limit, as written (unreduced: samplers draw below them)."""
    value = entry(description, key)
    parts = value.split("/") if isinstance(value, str) else []
    if len(parts) != 2 or not all(part.isascii() and part.isdigit() and part[0] != "0" for part in parts):
        raise invalid(f"{key!r} must be a ratio of positive integers 'a/b', got {value!r}")
    a, b = int(parts[0]), int(parts[1])
    if a > limit or b > limit:
        raise invalid(f"{key!r} is {value}: its integers must be at most {limit}")
    return a, b


def agrees(description: dict, key: str, rebuilt: Any) -> None:
    """A number the description states and the rebuilt object computes (its certified ε, its outputs) must be the
    same: otherwise the document does not describe the object it rebuilds to."""
    stated = entry(description, key)
    if not _is_number(stated) or stated != rebuilt:
        raise invalid(f"{key!r} is {stated!r}, but the described mechanism's is {rebuilt!r}")


@contextmanager
def building(what: str) -> Iterator[None]:
    """Constructs an object from checked fields: its own refusals (a certification above ε, bins outside the
    outputs, labels out of order) mean the document is inconsistent."""
    try:
        yield
    except InvalidMechanismDocument:
        raise
    except (ValueError, ArithmeticError) as err:  # LabelDPError (CertificationError, invalid_domain) is a ValueError
        raise invalid(f"{what}: {err}") from None
