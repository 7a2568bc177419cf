"""How long a DP-quantile release's padded work takes — counting the labels' ranks and the exact exponential
mechanism's draws (``labels_party.core.quantiles``, what runs inside ``at_least``) — on the labels that cost most,
against the floor it is padded to (``draw_floor_seconds``). The floor must sit above every case here with room to spare:
a computation that overruns it answers in a time that depends on the labels.

Run: `.venv/bin/python bench/quantile_timing.py [--repeats 3] [--quick] [--json]`

Cases: integer-range domains of 52, 10³ and 10⁵ candidates; 10³, 10⁵ and 10⁶ labels; 1, 3 and 100 quantiles;
ε = 0.1, 1 and 10 (the rate sets how many Bernoulli(exp(−1)) rounds a trial runs); labels
* ``one-value``: all at one candidate (the sampler's worst acceptance: every other candidate is far),
* ``two-ends``: half at the lowest candidate, half at the highest,
* ``spread-shuffled``: uniform over the candidates in random order (the binary searches' worst memory pattern),
* ``spread-sorted``: the same, sorted.
Each case runs ``--repeats`` times in this process (one thread; the machine's other load is what it is: the JSON
records the load average). Reported: the slowest time, the floor, and their ratio (``slack``: floor / slowest).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from labels_party.core.quantiles import RankCounts, draw_floor_seconds, plan_quantiles, release_quantiles  # noqa: E402
from shared.domains import integer_range  # noqa: E402

SHAPES = ("one-value", "two-ends", "spread-shuffled", "spread-sorted")


def labels_of(shape: str, n: int, m: int, rng: np.random.Generator) -> np.ndarray:
    if shape == "one-value":
        return np.full(n, m // 3, dtype=np.float64)
    if shape == "two-ends":
        return np.where(np.arange(n) % 2 == 0, 0, m - 1).astype(np.float64)
    spread = rng.integers(0, m, size=n).astype(np.float64)
    return np.sort(spread) if shape == "spread-sorted" else spread


def measure(m: int, n: int, k: int, epsilon: float, shape: str, repeats: int) -> dict:
    domain = integer_range(0, m - 1)
    quantiles = np.linspace(0, 1, k + 2)[1:-1] if k > 1 else [0.5]
    plan = plan_quantiles(domain, [float(q) for q in quantiles], epsilon)
    rng = np.random.default_rng(0)  # a benchmark: seeded
    labels = labels_of(shape, n, m, rng)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        counts = RankCounts(plan.candidates)
        counts.add(labels)
        release_quantiles(plan, counts, rng)
        times.append(time.perf_counter() - started)
    floor = draw_floor_seconds(n, m, k)
    return {"candidates": m, "labels": n, "quantiles": k, "epsilon": epsilon, "shape": shape,
            "slowest_seconds": max(times), "median_seconds": float(np.median(times)), "floor_seconds": floor,
            "slack": floor / max(times)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="10⁵ labels at most, 1 and 3 quantiles, ε = 1")
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    args = parser.parse_args(argv)
    sizes = (1_000, 100_000) if args.quick else (1_000, 100_000, 1_000_000)
    ks = (1, 3) if args.quick else (1, 3, 100)
    epsilons = (1.0,) if args.quick else (0.1, 1.0, 10.0)
    cases = []
    for m, n, k, epsilon, shape in itertools.product((52, 1_000, 100_000), sizes, ks, epsilons, SHAPES):
        if k == 100 and n > 100_000 and epsilon != 1.0:
            continue  # the draws dominate at 100 quantiles; one ε shows them on the largest tables
        cases.append(measure(m, n, k, epsilon, shape, args.repeats))
        if not args.json:
            c = cases[-1]
            print(f"m={m:>6} n={n:>8} k={k:>3} ε={epsilon:<4g} {shape:<16} slowest {c['slowest_seconds']:.3f} s "
                  f"floor {c['floor_seconds']:.3f} s slack {c['slack']:.1f}", flush=True)
    tightest = min(cases, key=lambda c: c["slack"])
    summary = {"benchmark": "quantile_timing", "command": "python bench/quantile_timing.py " + " ".join(
                   sys.argv[1:] if argv is None else argv), "machine": platform.machine(),
               "cpus": os.cpu_count(), "load_average": os.getloadavg(), "repeats": args.repeats,
               "tightest": tightest, "overruns": sum(c["slack"] < 1 for c in cases), "cases": cases}
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"tightest: {tightest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
