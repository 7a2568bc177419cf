"""The release-time random source is AES-128-CTR keyed from os.urandom, and every number a release publishes is
drawn through integer draws alone (no float sampling anywhere on the release path)."""

from __future__ import annotations

import hashlib
import hmac

import numpy as np
import pytest

import shared.randomness as randomness
from labels_party.core.evaluation import evaluate
from labels_party.core.pipeline import prepare_groups, privatize_by_group, privatize_labels
from labels_party.core.prior import estimate_prior
from labels_party.core.registry import MechanismOptions, build_mechanism
from labels_party.core.solvers.rr_with_prior import rr_with_prior_per_example
from shared.domains import Classes, ContinuousInterval, FiniteLabels, integer_range


class IntegersOnly:
    """A generator that only answers ``integers``: any float draw (random, laplace, geometric, normal, choice with
    probabilities, …) raises, so a sampler that runs on it provably uses integer draws only."""

    def __init__(self, seed: int):
        self._rng = np.random.default_rng(seed)
        self.calls = 0

    def integers(self, *args, **kwargs):
        self.calls += 1
        return self._rng.integers(*args, **kwargs)

    def __getattr__(self, name):
        raise AssertionError(f"release-time sampling called Generator.{name}: not an exact integer draw")


def test_the_keystream_is_aes_128_ctr_under_an_os_key(monkeypatch):
    """randomgen's AESCounter output is AES-128-ECB of the little-endian counter blocks 0, 1, 2, …, under the key
    from os.urandom — checked against pyca/cryptography's AES."""
    ciphers = pytest.importorskip("cryptography.hazmat.primitives.ciphers")
    key = bytes(range(16))
    monkeypatch.setattr(randomness.os, "urandom", lambda n: key[:n])
    raw = randomness.secure_rng().bit_generator.random_raw(16)
    encryptor = ciphers.Cipher(ciphers.algorithms.AES(key), ciphers.modes.ECB()).encryptor()
    blocks = b"".join(encryptor.update(counter.to_bytes(16, "little")) for counter in range(8))
    expected = np.frombuffer(blocks, dtype="<u8")
    np.testing.assert_array_equal(raw, expected)


def test_every_call_gets_a_fresh_key():
    a = randomness.secure_rng().integers(0, 2**62, size=4)
    b = randomness.secure_rng().integers(0, 2**62, size=4)
    assert not np.array_equal(a, b)


PRIOR12 = np.linspace(1.0, 3.0, 12) ** 2
INTEGERS = np.arange(1000) % 12 + 1.0
FRACTIONS = np.linspace(0.5, 3.0, 1000)
CLASSES = (np.arange(1000) % 5).astype(float)


@pytest.mark.parametrize(("name", "domain", "options", "labels"), [
    ("opt-unbiased", integer_range(1, 12), MechanismOptions(mesh=24), INTEGERS),
    ("opt-unbiased", integer_range(1, 12), MechanismOptions(solver="continuous"), INTEGERS),
    ("rr-on-bins", integer_range(1, 12), MechanismOptions(), INTEGERS),
    ("dbrr", integer_range(1, 12), MechanismOptions(), INTEGERS),
    ("rr", integer_range(1, 12), MechanismOptions(), INTEGERS),
    ("laplace", integer_range(1, 12), MechanismOptions(), INTEGERS),
    ("laplace", integer_range(1, 12), MechanismOptions(clip=True), INTEGERS),
    ("staircase", integer_range(1, 12), MechanismOptions(), INTEGERS),
    ("staircase", FiniteLabels(np.array([0.5, 1.25, 3.0])), MechanismOptions(clip=True), FRACTIONS),
    ("laplace", ContinuousInterval(0.5, 3.0, 21), MechanismOptions(), FRACTIONS),
    ("opt-unbiased", ContinuousInterval(0.5, 3.0, 12), MechanismOptions(mesh=24), FRACTIONS),
    ("rr", Classes(5), MechanismOptions(), CLASSES),
    ("rr-with-prior", Classes(12), MechanismOptions(), CLASSES),
    ("subset", Classes(5), MechanismOptions(), CLASSES),
])
def test_mechanisms_sample_with_integer_draws_only(name, domain, options, labels):
    prior = PRIOR12 if name in ("opt-unbiased", "rr-on-bins", "rr-with-prior") else None
    mechanism = build_mechanism(name, domain, 1.0, prior, options)
    rng = IntegersOnly(1)
    out = mechanism.sample(labels, rng)
    assert len(out) == labels.size and rng.calls > 0


def test_release_pipelines_use_integer_draws_only():
    """Every release-time sampler runs on a generator that refuses float draws, draws something, and releases a
    value per example."""
    weeks = np.clip(np.round(np.random.default_rng(0).normal(30, 8, size=5000)), 1, 52)
    for seed, mechanism in enumerate(("opt-unbiased", "rr-on-bins", "laplace", "staircase", "dbrr"), start=10):
        rng = IntegersOnly(seed)
        assert privatize_labels(integer_range(1, 52), weeks, mechanism, 1.0, rng).noisy_labels.size == weeks.size
        assert rng.calls > 0, mechanism
    rng = IntegersOnly(3)
    assert privatize_labels(ContinuousInterval(0, 60, 31), weeks + 0.5, "opt-unbiased", 1.0, rng).noisy_labels.size \
        == weeks.size and rng.calls > 0
    groups = (weeks > 30).astype(int)
    rng = IntegersOnly(4)
    grouped = privatize_by_group(prepare_groups(integer_range(1, 52), "opt-unbiased", 2.0, prior_epsilon=0.5), weeks,
                                 groups, rng)
    assert grouped.noisy_labels.size == weeks.size and len(grouped.parts) == 2 and rng.calls > 0
    rng = IntegersOnly(5)
    assert estimate_prior(np.array([5, 0, 3]), 0.5, rng).weights.size == 3 and rng.calls > 0
    priors = np.random.default_rng(1).dirichlet(np.ones(6), size=300)
    rng = IntegersOnly(6)
    assert rr_with_prior_per_example(priors, np.arange(300) % 6, 1.0, rng).outputs.size == 300 and rng.calls > 0
    for metric in ("mse", "poisson", "accuracy"):
        rng = IntegersOnly(7)
        evaluate(metric, np.linspace(0, 5, 300), np.arange(300) % 6, 1.0, 10.0, rng)
        assert rng.calls > 0, metric


def test_a_seeded_source_repeats_its_streams_call_by_call():
    first, second = randomness.SeededSource(7), randomness.SeededSource(7)
    draws = [first().integers(0, 2**53, size=4) for _ in range(3)]
    assert all(np.array_equal(d, second().integers(0, 2**53, size=4)) for d in draws)
    # The n-th call is default_rng([seed, n]): calls differ from each other and from another seed.
    np.testing.assert_array_equal(draws[2], np.random.default_rng([7, 2]).integers(0, 2**53, size=4))
    assert not np.array_equal(draws[0], draws[1])
    assert not np.array_equal(draws[0], randomness.SeededSource(8)().integers(0, 2**53, size=4))


SECRET = bytes(range(32))


def _rfc5869_key(secret: bytes, info: bytes, length: int = 16) -> bytes:
    """HKDF-SHA256 from RFC 5869 with the standard library's HMAC (no salt: a hash length of zeros)."""
    prk = hmac.new(b"\0" * 32, secret, hashlib.sha256).digest()
    okm, block = b"", b""
    for counter in range(1, -(-length // 32) + 1):
        block = hmac.new(prk, block + info + bytes([counter]), hashlib.sha256).digest()
        okm += block
    return okm[:length]


def test_a_derived_stream_is_a_function_of_the_secret_and_context_only():
    first = randomness.derived_rng(SECRET, "partition", 3).integers(0, 2**62, size=8)
    again = randomness.derived_rng(SECRET, "partition", 3).integers(0, 2**62, size=8)
    np.testing.assert_array_equal(first, again)
    others = [randomness.derived_rng(SECRET, "partition", 4), randomness.derived_rng(SECRET, "other", 3),
              randomness.derived_rng(SECRET, "partition"), randomness.derived_rng(SECRET, "partition", "3"),
              randomness.derived_rng(bytes(range(1, 33)), "partition", 3)]
    for rng in others:
        assert not np.array_equal(first, rng.integers(0, 2**62, size=8))


def test_contexts_are_encoded_without_ambiguity():
    encodings = {randomness.derivation_info(*context) for context in
                 [("a/b",), ("a", "b"), ("ab",), ("1",), (1,), ("partition", 12), ("partition", 1, 2), ()]}
    assert len(encodings) == 8
    with pytest.raises(TypeError):
        randomness.derivation_info(True)
    with pytest.raises(ValueError, match="at least 16 bytes"):
        randomness.derived_rng(b"short", "partition", 0)


def test_derived_stream_known_answer():
    """Pinned once: the first draws for a fixed secret and context (a change of encoding, KDF or generator is a
    change of every future release's noise, and must be deliberate). The key is checked against an independent
    RFC 5869 computation and the keystream against AES-128-ECB of the counter blocks, as for secure_rng."""
    rng = randomness.derived_rng(SECRET, "partition", 0)
    assert rng.integers(0, 2**63, size=4, dtype=np.int64).tolist() == [
        3460788401463463238, 731793057443233314, 8950205839167170648, 4025651166794502399]
    info = b"labeldp/derived-rng/v1" + b"s\0\0\0\x09partition" + b"i\0\0\0\x010"
    assert randomness.derivation_info("partition", 0) == info
    key = _rfc5869_key(SECRET, info)
    ciphers = pytest.importorskip("cryptography.hazmat.primitives.ciphers")
    encryptor = ciphers.Cipher(ciphers.algorithms.AES(key), ciphers.modes.ECB()).encryptor()
    blocks = b"".join(encryptor.update(counter.to_bytes(16, "little")) for counter in range(4))
    raw = randomness.derived_rng(SECRET, "partition", 0).bit_generator.random_raw(8)
    np.testing.assert_array_equal(raw, np.frombuffer(blocks, dtype="<u8"))


def test_release_secrets_are_fresh_256_bit_values():
    first, second = randomness.new_release_secret(), randomness.new_release_secret()
    assert len(first) == len(second) == 32 and first != second
