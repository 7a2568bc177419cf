"""Where release-time randomness comes from.

Every privatized number is a function of the random bits it was drawn with, so those bits must be unpredictable
to whoever receives the result. A statistical generator (numpy's default PCG64) is not: its state can be
recovered from enough outputs. Releases therefore draw from :func:`secure_rng` — AES-128 in counter mode
(randomgen's ``AESCounter``; AES-NI when the CPU has it), keyed with 128 fresh bits from ``os.urandom`` for every
release. ``tests/shared/test_randomness.py`` checks its keystream against the ``cryptography`` package's AES.

The interface is numpy's :class:`~numpy.random.Generator`, and the samplers that produce released numbers only
call ``integers`` on it (numpy's bounded integers reject on the bit stream, so they are exactly uniform given
uniform bits). Tests and benchmarks pass ``np.random.default_rng(seed)`` instead — seeds exist only there.
"""

from __future__ import annotations

import itertools
import os

import numpy as np
from randomgen import AESCounter

KEY_BYTES = 16  # AES-128


def secure_rng() -> np.random.Generator:
    """A generator over an AES-128-CTR keystream with a fresh key from the operating system's entropy pool.

    A new key per call: no state is shared between releases, threads or forked workers."""
    return np.random.Generator(AESCounter(key=int.from_bytes(os.urandom(KEY_BYTES), "little")))


class SeededSource:
    """A repeatable source of release randomness, for tests and benchmarks only (never a service setting): the
    n-th call returns ``np.random.default_rng([seed, n])``, so a run that makes the same releases in the same
    order draws the same noise. Inject it with ``make_context(random_source=SeededSource(seed))``."""

    def __init__(self, seed: int):
        self._seed = int(seed)
        self._calls = itertools.count()

    def __call__(self) -> np.random.Generator:
        return np.random.default_rng([self._seed, next(self._calls)])
