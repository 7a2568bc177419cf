"""Opt-unbiased LP (Algorithm 1, compact DP rows, HiGHS) on labels 1..52 at ε = 1: solve time and noisy-label
loss per output mesh, next to the paper's App. G.3 table (its census prior is not public; ours is a real
weeks-worked prior from the PSID, so the losses are comparable in scale only).

Run: `.venv/bin/python bench/lp_mesh.py [--meshes 52,416,1664] [--epsilon 1]`
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

from realistic_priors import psid_weeks_worked

from labels_party.core.solvers.opt_unbiased_mesh import solve_optimal_unbiased

PAPER = {52: (2.38, 1288.21), 416: (17.1, 1275.22), 1664: (161.0, 1274.71)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--meshes", default="52,416,1664")
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--out", default="bench-output/lp_mesh.json")
    args = parser.parse_args()
    values, counts, source = psid_weeks_worked()
    prior = counts / counts.sum()
    print(f"prior: {source}; ε = {args.epsilon}; machine: {platform.processor() or platform.machine()}")
    print(f"{'mesh':>6}{'seconds':>10}{'noisy loss':>13}{'outputs':>9}{'certified ε':>14}"
          f"{'paper s':>10}{'paper loss':>12}")
    rows = []
    for mesh in (int(m) for m in args.meshes.split(",")):
        started = time.perf_counter()
        mechanism = solve_optimal_unbiased(values, prior, args.epsilon, mesh=mesh)
        seconds = time.perf_counter() - started
        paper_s, paper_loss = PAPER.get(mesh, (float("nan"), float("nan")))
        row = {"mesh": mesh, "seconds": seconds, "noisy_label_loss": mechanism.noisy_label_loss(prior),
               "num_outputs": mechanism.num_outputs, "certified_epsilon": mechanism.certified_epsilon,
               "max_abs_bias": mechanism.max_abs_bias, "paper_seconds": paper_s, "paper_loss": paper_loss}
        rows.append(row)
        print(f"{mesh:>6}{seconds:>10.2f}{row['noisy_label_loss']:>13.2f}{mechanism.num_outputs:>9}"
              f"{mechanism.certified_epsilon:>14.9f}{paper_s:>10.2f}{paper_loss:>12.2f}", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"prior": source, "epsilon": args.epsilon, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
