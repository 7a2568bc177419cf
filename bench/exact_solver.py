"""The optimal unbiased randomizer: the straightforward mesh LP (52/416/1664 outputs) next to the continuous solver
(continuous outputs: cone program over interval signatures + HiGHS vertex + certified gap), on the same prior;
then |Y| = 400. The ratio column is mesh-LP seconds / exact seconds at the mesh LP's ε.

Run: `.venv/bin/python bench/exact_solver.py [--meshes 52,416,1664] [--epsilons 0.25,0.5,1,2,4,8]
[--epsilons-400 0.5,1,4,8] [--skip-400]`
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from realistic_priors import psid_weeks_worked

from labels_party.solvers.opt_unbiased_continuous import solve_continuous_optimal_unbiased
from labels_party.solvers.opt_unbiased_mesh import solve_optimal_unbiased


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--meshes", default="52,416,1664")
    parser.add_argument("--mesh-epsilon", type=float, default=1.0)
    parser.add_argument("--epsilons", default="0.25,0.5,1,2,4,8")
    parser.add_argument("--epsilons-400", default="0.5,1,4,8")
    parser.add_argument("--skip-400", action="store_true")
    args = parser.parse_args()
    values, counts, source = psid_weeks_worked()
    prior = counts / counts.sum()
    print(f"prior: {source}, labels 1..52\n")
    print(f"{'method':<22}{'ε':>6}{'seconds':>10}{'noisy loss':>14}{'gap':>11}{'outputs':>9}{'speed-up':>10}")
    exact = solve_continuous_optimal_unbiased(values, prior, args.mesh_epsilon)  # warm-up: first-call imports
    exact = solve_continuous_optimal_unbiased(values, prior, args.mesh_epsilon)
    for mesh in (int(m) for m in args.meshes.split(",")):
        started = time.perf_counter()
        mechanism = solve_optimal_unbiased(values, prior, args.mesh_epsilon, mesh=mesh)
        seconds = time.perf_counter() - started
        loss = mechanism.noisy_label_loss(prior)
        print(f"{'mesh LP ' + str(mesh):<22}{args.mesh_epsilon:>6g}{seconds:>10.2f}{loss:>14.4f}"
              f"{(loss - exact.lower_bound) / loss:>11.2e}{mechanism.num_outputs:>9}"
              f"{seconds / exact.seconds:>9.0f}x", flush=True)
    for epsilon in (float(e) for e in args.epsilons.split(",")):
        solution = solve_continuous_optimal_unbiased(values, prior, epsilon)
        loss = solution.mechanism.noisy_label_loss(prior)
        print(f"{'exact':<22}{epsilon:>6g}{solution.seconds:>10.3f}{loss:>14.4f}"
              f"{solution.optimality_gap:>11.2e}{solution.mechanism.num_outputs:>9}", flush=True)
    if not args.skip_400:
        values = np.arange(1.0, 401.0)
        log_normal = np.exp(-0.5 * ((np.log(values) - 3.5) / 1.0) ** 2) / values  # revenue-like shape ...
        log_normal[-1] += 0.05 * log_normal.sum()  # ... with the clipping spike at the 95th percentile
        priors = {"log-normal + spike": log_normal, "uniform": np.ones(400), "geometric 0.99^y": 0.99 ** values}
        print("\n|Y| = 400 (revenue 1..400 €; synthetic priors)")
        print(f"{'method':<28}{'ε':>6}{'seconds':>10}{'noisy loss':>14}{'gap':>11}{'outputs':>9}")
        for name, prior in priors.items():
            for epsilon in (float(e) for e in args.epsilons_400.split(",")):
                solution = solve_continuous_optimal_unbiased(values, prior, epsilon)
                print(f"{'exact, ' + name:<28}{epsilon:>6g}{solution.seconds:>10.3f}"
                      f"{solution.mechanism.noisy_label_loss(prior / prior.sum()):>14.4f}"
                      f"{solution.optimality_gap:>11.2e}{solution.mechanism.num_outputs:>9}", flush=True)

if __name__ == "__main__":
    main()
