"""Stress run of the continuous optimal unbiased solver: 150 fixed-seed cases (|Y| = 2…120; Dirichlet, spiky, uniform
and zero-heavy priors; ε = 0.05…10). Prints time, certified gap and outputs per case and flags any case whose gap
exceeds 1e-6, whose certified ε exceeds ε or whose bias exceeds 1e-9 (relative to the largest label).

Run: `.venv/bin/python bench/exact_solver_stress.py`
"""

from __future__ import annotations

import time

import numpy as np

from labels_party.core.solvers.opt_unbiased_continuous import solve_continuous_optimal_unbiased

KINDS = ("dirichlet-1", "dirichlet-0.1", "uniform", "zeros", "spike")


def prior_of(kind: str, k: int, rng: np.random.Generator) -> np.ndarray:
    if kind == "dirichlet-1":
        return rng.dirichlet(np.ones(k))
    if kind == "dirichlet-0.1":
        return rng.dirichlet(np.full(k, 0.1))
    if kind == "uniform":
        return np.ones(k)
    if kind == "zeros":
        prior = rng.dirichlet(np.ones(k))
        prior[rng.random(k) < 0.3] = 0.0
        if prior.sum() == 0:
            prior[0] = 1.0
        return prior
    prior = np.full(k, 1e-3)
    prior[k // 3] = 1.0
    return prior


def main() -> None:
    rng = np.random.default_rng(123)
    flagged = 0
    for k in (2, 3, 5, 20, 52, 120):
        for kind in KINDS:
            for epsilon in (0.05, 0.5, 2.0, 6.0, 10.0):
                prior = prior_of(kind, k, rng)
                values = np.arange(1.0, k + 1)
                if kind == "dirichlet-1":  # irregular label spacing
                    values = np.sort(rng.choice(np.arange(10 * k), k, replace=False)).astype(float)
                started = time.perf_counter()
                solution = solve_continuous_optimal_unbiased(values, prior, epsilon)
                seconds = time.perf_counter() - started
                mechanism = solution.mechanism
                ok = (solution.optimality_gap <= 1e-6 and mechanism.certified_epsilon <= epsilon
                      and mechanism.max_abs_bias <= 1e-9 * max(1.0, values.max()))
                flagged += not ok
                print(f"|Y|={k:4d} {kind:14s} ε={epsilon:5g} {seconds:7.3f}s gap {solution.optimality_gap:.2e} "
                      f"outputs {mechanism.num_outputs:4d} {'ok' if ok else 'FLAGGED'}", flush=True)
    print(f"\n{flagged} of {6 * len(KINDS) * 5} cases flagged")


if __name__ == "__main__":
    main()
