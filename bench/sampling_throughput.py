"""Sampling throughput: privatize 10^7 labels with an opt-unbiased randomizer (exact integer-threshold sampler).

Run: `.venv/bin/python bench/sampling_throughput.py [--n 10000000]`
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from realistic_priors import psid_weeks_worked

from labels_party.solvers.opt_unbiased import solve_optimal_unbiased
from shared.mechanisms.subset import SubsetSelectionRandomizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=10_000_000)
    args = parser.parse_args()
    values, counts, source = psid_weeks_worked()
    prior = counts / counts.sum()
    mechanism = solve_optimal_unbiased(values, prior, 1.0, mesh=104)
    rng = np.random.default_rng(0)
    labels = rng.choice(values, size=args.n, p=prior)
    for _ in range(2):
        started = time.perf_counter()
        noisy = mechanism.sample(labels, rng)
        seconds = time.perf_counter() - started
        print(f"opt-unbiased ({mechanism.num_outputs} outputs): {args.n:,} labels in {seconds:.2f} s "
              f"= {args.n / seconds:,.0f} labels/s; mean shift {np.mean(noisy - labels):+.3f}")
    subset = SubsetSelectionRandomizer.build(10, 1.0)
    classes = rng.integers(0, 10, size=args.n // 10)
    started = time.perf_counter()
    subset.sample(classes, rng)
    seconds = time.perf_counter() - started
    print(f"subset (K=10): {classes.size:,} labels in {seconds:.2f} s = {classes.size / seconds:,.0f} labels/s")


if __name__ == "__main__":
    main()
