"""Where release-time randomness comes from.

Every privatized number is a function of the random bits it was drawn with, so those bits must be unpredictable
to whoever receives the result. A statistical generator (numpy's default PCG64) is not: its state can be
recovered from enough outputs. Releases therefore draw from :func:`secure_rng` — AES-128 in counter mode
(randomgen's ``AESCounter``; AES-NI when the CPU has it), keyed with 128 fresh bits from ``os.urandom`` for every
release. ``tests/shared/test_randomness.py`` checks its keystream against the ``cryptography`` package's AES.

The interface is numpy's :class:`~numpy.random.Generator`, and the samplers that produce released numbers only
call ``integers`` on it (numpy's bounded integers reject on the bit stream, so they are exactly uniform given
uniform bits). Tests and benchmarks pass ``np.random.default_rng(seed)`` instead — seeds exist only there.

A release computed in pieces on other machines (a Spark job, one task per partition of the labels) cannot share one
generator, and a piece that is run twice — a failed task retried, a lost executor's work recomputed — must draw the
same noise both times: two independent noisy copies of one label would spend its ε twice. :func:`derived_rng` gives
each piece its own stream, a function of a per-release secret (:func:`new_release_secret`) and the piece's name
alone: the AES key is HKDF-SHA256 (RFC 5869) of the secret with the name as ``info``. Streams of different names
are independent (HKDF's outputs for distinct ``info`` are independent pseudorandom keys); the same name always
yields the same stream. The secret is therefore as sensitive as the labels while it exists — with it and the
released values, the noise could be recomputed — and must never be logged or stored beside the release.
"""

from __future__ import annotations

import itertools
import os

import numpy as np
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from randomgen import AESCounter

KEY_BYTES = 16  # AES-128
RELEASE_SECRET_BYTES = 32  # HKDF-SHA256's input keying material: a full hash width of entropy
DERIVED_INFO_PREFIX = b"labeldp/derived-rng/v1"


def secure_rng() -> np.random.Generator:
    """A generator over an AES-128-CTR keystream with a fresh key from the operating system's entropy pool.

    A new key per call: no state is shared between releases, threads or forked workers."""
    return np.random.Generator(AESCounter(key=int.from_bytes(os.urandom(KEY_BYTES), "little")))


def new_release_secret() -> bytes:
    """256 fresh bits from the operating system for one release's :func:`derived_rng` streams."""
    return os.urandom(RELEASE_SECRET_BYTES)


def derived_rng(secret: bytes, *context: str | int) -> np.random.Generator:
    """The AES-128-CTR generator keyed with HKDF-SHA256(secret, info = the encoded ``context``).

    Deterministic in (secret, context), so a recomputed piece of a release redraws exactly its earlier noise; a
    different context (another partition, another purpose) gets an independent stream."""
    if not isinstance(secret, bytes) or len(secret) < KEY_BYTES:
        raise ValueError(f"a release secret is at least {KEY_BYTES} bytes (new_release_secret() makes one)")
    hkdf = HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=derivation_info(*context))
    return np.random.Generator(AESCounter(key=int.from_bytes(hkdf.derive(secret), "little")))


def derivation_info(*context: str | int) -> bytes:
    """HKDF's ``info`` for a context: each part tagged with its type and length-prefixed, so that no two contexts
    share an encoding (``("a/b",)`` and ``("a", "b")``, or ``("1",)`` and ``(1,)``, derive different keys)."""
    info = bytearray(DERIVED_INFO_PREFIX)
    for part in context:
        if isinstance(part, str):
            tag, data = b"s", part.encode("utf-8")
        elif isinstance(part, int) and not isinstance(part, bool):
            tag, data = b"i", str(part).encode("ascii")
        else:
            raise TypeError(f"a derivation context is made of str and int, not {type(part).__name__}")
        info += tag + len(data).to_bytes(4, "big") + data
    return bytes(info)


class SeededSource:
    """A repeatable source of release randomness, for tests and benchmarks only (never a service setting): the
    n-th call returns ``np.random.default_rng([seed, n])``, so a run that makes the same releases in the same
    order draws the same noise. Inject it with ``make_context(random_source=SeededSource(seed))``."""

    def __init__(self, seed: int):
        self._seed = int(seed)
        self._calls = itertools.count()

    def __call__(self) -> np.random.Generator:
        return np.random.default_rng([self._seed, next(self._calls)])
