"""The public holdout split (shared/splits.py): the documented number recomputed by hand, membership independent of
order and of the other ids, the held-out share within 4 sd of the fraction, and independent splits per seed."""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.splits import holdout_mask, holdout_uniforms

ids_strategy = st.lists(st.text(min_size=1, max_size=20), min_size=1, max_size=200, unique=True)
seeds = st.integers(min_value=0, max_value=2**63)
fractions = st.floats(min_value=0.01, max_value=0.9)


def by_hand(example_id: str, seed: int) -> float:
    """The module's description, written out: SHA-256 of "seed:id", first 8 bytes big-endian, top 53 bits / 2**53."""
    digest = hashlib.sha256(f"{seed}:{example_id}".encode()).digest()
    return (int.from_bytes(digest[:8], "big") >> 11) / 2**53


@given(ids=ids_strategy, seed=seeds)
def test_the_number_is_the_documented_one(ids, seed):
    assert holdout_uniforms(ids, seed).tolist() == [by_hand(i, seed) for i in ids]


@given(ids=ids_strategy, seed=seeds, fraction=fractions, data=st.data())
def test_the_same_ids_in_any_order_or_company_have_the_same_membership(ids, seed, fraction, data):
    mask = dict(zip(ids, holdout_mask(ids, fraction, seed), strict=True))
    shuffled = data.draw(st.permutations(ids))
    assert dict(zip(shuffled, holdout_mask(shuffled, fraction, seed), strict=True)) == mask
    subset = data.draw(st.lists(st.sampled_from(ids), min_size=1, unique=True))
    assert [mask[i] for i in subset] == holdout_mask(subset, fraction, seed).tolist()


@settings(max_examples=8, deadline=None)
@given(seed=seeds, fraction=fractions, id_seed=st.integers(0, 2**32 - 1))
def test_the_held_out_share_of_100k_ids_is_within_4_sd_of_the_fraction(seed, fraction, id_seed):
    ids = [f"{x:x}" for x in np.random.default_rng(id_seed).integers(0, 2**63, size=100_000)]
    share = holdout_mask(ids, fraction, seed).mean()
    assert abs(share - fraction) < 4 * math.sqrt(fraction * (1 - fraction) / len(ids))


@settings(max_examples=20, deadline=None)
@given(seeds=st.lists(seeds, min_size=2, max_size=2, unique=True), fraction=fractions)
def test_different_seeds_give_independent_splits(seeds, fraction):
    """Two seeds agree on an id as often as two independent draws would (f² + (1-f)²), within 4 sd."""
    ids = [f"user-{i}" for i in range(20_000)]
    first, second = (holdout_mask(ids, fraction, s) for s in seeds)
    agree = fraction**2 + (1 - fraction) ** 2
    assert abs(np.mean(first == second) - agree) < 4 * math.sqrt(agree * (1 - agree) / len(ids))


def test_ids_are_hashed_as_text_and_the_ends_of_the_range_hold_none_or_all():
    assert holdout_mask([7, 8], 0.5, 3).tolist() == holdout_mask(["7", "8"], 0.5, 3).tolist()
    ids = [str(i) for i in range(1000)]
    assert not holdout_mask(ids, 0.0, 1).any() and holdout_mask(ids, 1.0, 1).all()
    assert holdout_mask([], 0.5, 1).shape == (0,)


@pytest.mark.parametrize(("fraction", "seed"), [(-0.1, 0), (1.5, 0), (0.2, -1), (0.2, 1.5), (0.2, True)])
def test_out_of_range_arguments_are_refused(fraction, seed):
    with pytest.raises(ValueError):
        holdout_mask(["a"], fraction, seed)
