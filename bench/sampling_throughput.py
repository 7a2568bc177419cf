"""Sampling throughput on one core: privatize 10^7 labels with a finite randomizer (the optimal unbiased randomizer
for the PSID weeks-worked prior, 88 outputs), subset selection and the exact additive noises, with the generator
releases use (AES-128-CTR keyed from os.urandom) and, for comparison, numpy's PCG64.

Run: `.venv/bin/python bench/sampling_throughput.py [--n 10000000] [--repeats 5] [--json]`
Each figure is the best of ``--repeats`` runs (this machine's timings vary run to run); the goal for the finite
randomizer (the hot-paths issue) is >= 5·10^7 labels/s on one core with the AES source. Sampling works in chunks of
65,536 labels, so beyond the labels and the released values memory does not grow with n: the JSON reports the
process's peak RSS (run with --n 100000000 to see it for 10^8 labels).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import time

import numpy as np
from realistic_priors import psid_weeks_worked

from labels_party.core.pate import aggregate, calibrate_variance
from labels_party.core.registry import build_mechanism
from labels_party.core.solvers.opt_unbiased_continuous import solve_continuous_optimal_unbiased
from shared.domains import Classes, integer_range
from shared.randomness import secure_rng

GOAL_LABELS_PER_SECOND = 5e7


def best_rate(sample, labels, repeats: int) -> tuple[float, float]:
    """(labels per second, seconds) of the fastest of ``repeats`` runs."""
    seconds = min(_timed(sample, labels) for _ in range(repeats))
    return labels.shape[0] / seconds, seconds


def _timed(sample, labels) -> float:
    started = time.perf_counter()
    sample(labels)
    return time.perf_counter() - started


def pate_votes(num_classes: int, variance: int):
    """PATE's aggregation as a sampler of one query per label: K discrete Gaussian draws and an arg-max."""
    class Votes:
        @staticmethod
        def sample(queries, rng):
            counts = np.zeros((len(queries), num_classes), dtype=np.int64)
            return aggregate(counts, variance, rng)
    return Votes()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=10_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core
    values, counts, source = psid_weeks_worked()
    prior = counts / counts.sum()
    finite = solve_continuous_optimal_unbiased(values, prior, 1.0).mechanism
    finite.sample(values, np.random.default_rng(0))  # build its alias table outside the timing
    labels = np.random.default_rng(0).choice(values, size=args.n, p=prior)
    classes = np.random.default_rng(1).integers(0, 10, size=args.n // 10).astype(np.float64)
    subset = build_mechanism("subset", Classes(10), 1.0)
    additive = {name: build_mechanism(name, integer_range(1, 52), 1.0) for name in ("laplace", "staircase")}
    outputs = f"opt-unbiased (finite, {finite.num_outputs} outputs)"
    cases = [(outputs, "aes-128-ctr", labels, finite, secure_rng()),
             (outputs, "pcg64", labels, finite, np.random.default_rng(2)),
             ("subset (K=10)", "aes-128-ctr", classes, subset, secure_rng())]
    cases += [(f"{name} (exact integer noise)", "aes-128-ctr", labels[: args.n // 10], mechanism, secure_rng())
              for name, mechanism in additive.items()]
    # the published peers (issue 41): RPWithPrior on the PSID prior, BlockRR on an imbalanced 10-class prior,
    # ALIBI's ten noisy coordinates per label, and PATE's discrete Gaussian votes (one draw per class per query)
    imbalanced = np.array([5000, 4900, 4700, 4600, 4500, 4800, 1000, 1500, 1000, 1500], dtype=np.float64)
    peers = {"rp-with-prior": (build_mechanism("rp-with-prior", integer_range(1, 52), 1.0, prior=counts), labels),
             "block-rr (K=10)": (build_mechanism("block-rr", Classes(10), 1.0, prior=imbalanced), classes),
             "alibi (K=10)": (build_mechanism("alibi", Classes(10), 1.0), classes)}
    cases += [(name, "aes-128-ctr", data[: args.n // 10], mechanism, secure_rng())
              for name, (mechanism, data) in peers.items()]
    votes = pate_votes(10, calibrate_variance(1.0, 1e-6, 1000))
    cases.append(("pate-fm votes (K=10, sigma^2 per draw)", "aes-128-ctr", classes[: args.n // 100], votes,
                  secure_rng()))
    results = []
    for name, generator, data, mechanism, rng in cases:
        rate, seconds = best_rate(lambda x, m=mechanism, g=rng: m.sample(x, g), data, args.repeats)
        results.append({"mechanism": name, "generator": generator, "labels": int(data.shape[0]),
                        "seconds": seconds, "labels_per_second": rate})
    report = {"benchmark": "sampling_throughput", "command": "python " + " ".join(__import__("sys").argv),
              "prior": source, "cores": 1, "repeats": args.repeats,
              "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
              "machine": platform.machine(), "goal_labels_per_second": GOAL_LABELS_PER_SECOND,
              "goal_met": results[0]["labels_per_second"] >= GOAL_LABELS_PER_SECOND, "results": results}
    if args.json:
        print(json.dumps(report))
        return
    for row in results:
        print(f"{row['mechanism']:<38} {row['generator']:<12} {row['labels']:>11,} labels in {row['seconds']:.3f} s "
              f"= {row['labels_per_second']:>13,.0f} labels/s")
    print(f"goal (finite randomizer, AES source): >= {GOAL_LABELS_PER_SECOND:,.0f} labels/s: "
          f"{'met' if report['goal_met'] else 'NOT met'}")


if __name__ == "__main__":
    main()
