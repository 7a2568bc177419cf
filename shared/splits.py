"""A train/holdout split anyone can compute from the example ids alone.

``holdout_mask(ids, fraction, seed)`` holds an example out when the SHA-256 of ``f"{seed}:{example_id}"``, read as a
number in [0, 1), is below ``fraction``. Each example's membership depends on its own id and the seed only — not on
the other ids, their order or their number — so the trainer (which sees only features), the labels party and the
user's own code draw the same split from the same public inputs, and a row added to a table later does not move any
other row across the split. A different seed gives an independent split.

The number: the first 8 bytes of the digest as a big-endian unsigned integer, its top 53 bits divided by 2⁵³ (the
doubles in [0, 1) with equal spacing). An id is hashed as the UTF-8 of its ``str``: ``7`` and ``"7"`` are the same
example, as they are once written to CSV. Nothing here is secret or random: the split is a published convention, not
a privacy mechanism (which rows are held out reveals nothing about any label).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import numpy as np

_BITS = 53  # a double's significand: every value k / 2**53 is exact


def holdout_uniforms(example_ids: Iterable[object], seed: int) -> np.ndarray:
    """Each id's number in [0, 1), in the order given (see the module's description)."""
    return _uniforms(example_ids, "", seed)


def part_uniforms(example_ids: Iterable[object], name: str, seed: int) -> np.ndarray:
    """Each id's number in [0, 1) for the split called ``name`` (a trainer's estimate rows, ``auto``'s parts): the
    SHA-256 of ``f"{name}:{seed}:{example_id}"``, so that it is independent of a holdout split with the same seed
    (whose prefix is only the seed) and of other names."""
    if not name or name[0].isdigit() or ":" in name:
        raise ValueError(f"a split's name starts with a letter and has no ':', not {name!r}")
    return _uniforms(example_ids, f"{name}:", seed)


def _uniforms(example_ids: Iterable[object], name: str, seed: int) -> np.ndarray:
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ValueError(f"a split's seed is a non-negative integer, not {seed!r}")
    prefix = f"{name}{int(seed)}:".encode()
    sha256 = hashlib.sha256
    digests = b"".join(sha256(prefix + str(i).encode()).digest()[:8] for i in example_ids)
    top = np.frombuffer(digests, dtype=">u8") >> np.uint64(64 - _BITS)
    return top.astype(np.float64) / float(1 << _BITS)


def holdout_mask(example_ids: Iterable[object], fraction: float, seed: int) -> np.ndarray:
    """True for the ids held out: those whose number (:func:`holdout_uniforms`) is below ``fraction`` in [0, 1].
    About ``fraction`` of any large set of distinct ids is held out (each id independently, as far as SHA-256 is
    a random function)."""
    if not 0.0 <= float(fraction) <= 1.0:
        raise ValueError(f"a holdout fraction is in [0, 1], not {fraction!r}")
    return holdout_uniforms(example_ids, seed) < float(fraction)
