"""The continuous optimal unbiased solver on wide label domains (the hot-paths issue): |Y| = 1000 and 5000 on three
priors from real tables — heavy-tailed (diamond prices), spiky (carats) and zero-heavy (hours worked) — each the
noisy ε₁ = 1 histogram the service would solve for, at ε = 0.25 … 8; then the PSID weeks-worked headline at
|Y| = 52 next to the mesh LP.

Run: `.venv/bin/python bench/exact_solver.py [--sizes 1000,5000] [--epsilons 0.25,0.5,1,2,4,8]
[--priors heavy-tailed,spiky,zero-heavy] [--meshes 52,416] [--json]`

Every case runs in a fresh process pinned to one core, so its time is one core's and its peak RSS (which includes
the interpreter and imports, ~200 MB) is its own. Goals: |Y| = 1000 within 5 s and 5000 within 60 s, with a
certified gap ≤ 1e-6, the certified ε ≤ ε and the bias ≤ 1e-9 of the label range.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import os
import platform
import resource
import sys
import time

GOALS = {1000: 5.0, 5000: 60.0}
GAP_GOAL = 1e-6


def _one_core() -> None:
    """Pin this (child) process to one core; its stdout goes to stderr, so that HiGHS's banner, which it prints
    when a solver object is made whatever its options, never mixes into the parent's JSON."""
    os.dup2(2, 1)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})


def exact_case(prior_kind: str, size: int, epsilon: float) -> dict:
    """One solve in this (fresh) process: the numbers the issue asks for."""
    _one_core()
    sys.path.insert(0, os.path.dirname(__file__))
    import numpy as np
    from realistic_priors import noisy_prior, psid_weeks_worked, table_histogram

    from labels_party.core.solvers.opt_unbiased_continuous import solve_continuous_optimal_unbiased

    if prior_kind == "psid-weeks":
        values, counts, source = psid_weeks_worked()
        prior = counts / counts.sum()
    else:
        values, counts, source = table_histogram(prior_kind, size)
        prior = noisy_prior(counts, 1.0, seed=size)
    started = time.perf_counter()
    solution = solve_continuous_optimal_unbiased(values, prior, epsilon)
    seconds = time.perf_counter() - started
    mechanism = solution.mechanism
    bias = mechanism.max_abs_bias / float(np.ptp(values))
    return {"solver": "continuous", "prior": prior_kind, "source": source, "labels": int(values.size),
            "epsilon": epsilon, "seconds": round(seconds, 3), "optimality_gap": solution.optimality_gap,
            "noisy_label_loss": mechanism.noisy_label_loss(prior), "outputs": int(mechanism.num_outputs),
            "certified_epsilon": mechanism.certified_epsilon, "relative_bias": bias,
            "cone_programs": solution.cone_programs, "signatures": int(mechanism.parameters["signatures"]),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "ok": bool(solution.optimality_gap <= GAP_GOAL and mechanism.certified_epsilon <= epsilon
                       and bias <= 1e-9)}


def mesh_case(mesh: int, epsilon: float) -> dict:
    _one_core()
    sys.path.insert(0, os.path.dirname(__file__))
    from realistic_priors import psid_weeks_worked

    from labels_party.core.solvers.opt_unbiased_mesh import solve_optimal_unbiased

    values, counts, source = psid_weeks_worked()
    prior = counts / counts.sum()
    started = time.perf_counter()
    mechanism = solve_optimal_unbiased(values, prior, epsilon, mesh=mesh)
    return {"solver": f"mesh LP {mesh}", "prior": "psid-weeks", "source": source, "labels": int(values.size),
            "epsilon": epsilon, "seconds": round(time.perf_counter() - started, 3),
            "noisy_label_loss": mechanism.noisy_label_loss(prior), "outputs": int(mechanism.num_outputs),
            "certified_epsilon": mechanism.certified_epsilon,
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def _run(function, *args) -> dict:
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
        return pool.submit(function, *args).result()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,5000")
    parser.add_argument("--epsilons", default="0.25,0.5,1,2,4,8")
    parser.add_argument("--priors", default="heavy-tailed,spiky,zero-heavy")
    parser.add_argument("--meshes", default="52,416", help="mesh LPs at ε = 1 on PSID (empty: none)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    epsilons = [float(e) for e in args.epsilons.split(",")]
    cases = []
    for size in (int(s) for s in args.sizes.split(",") if s):
        for kind in args.priors.split(","):
            for epsilon in epsilons:
                cases.append(_run(exact_case, kind, size, epsilon))
                if not args.json:
                    _print(cases[-1])
    for epsilon in epsilons:
        cases.append(_run(exact_case, "psid-weeks", 52, epsilon))
        if not args.json:
            _print(cases[-1])
    for mesh in (int(m) for m in args.meshes.split(",") if m):
        cases.append(_run(mesh_case, mesh, 1.0))
        if not args.json:
            _print(cases[-1])
    exact = [c for c in cases if c["solver"] == "continuous"]
    goals = {f"labels={size}": {"seconds_goal": goal,
                                "worst_seconds": max((c["seconds"] for c in exact if c["labels"] == size),
                                                     default=None)} for size, goal in GOALS.items()}
    report = {"benchmark": "exact_solver", "command": "python " + " ".join(sys.argv), "machine": platform.machine(),
              "cores": 1, "gap_goal": GAP_GOAL, "goals": goals,
              "all_certified_within_goal": all(c["ok"] for c in exact),
              "worst_gap": max(c["optimality_gap"] for c in exact), "cases": cases}
    if args.json:
        print(json.dumps(report))
    else:
        print(json.dumps({k: v for k, v in report.items() if k != "cases"}, indent=2))


def _print(case: dict) -> None:
    gap = f"{case['optimality_gap']:.1e}" if "optimality_gap" in case else "—"
    print(f"{case['solver']:<12} {case['prior']:<13} |Y|={case['labels']:<5} ε={case['epsilon']:<5g} "
          f"{case['seconds']:8.2f} s  gap {gap:>8}  outputs {case['outputs']:<6} "
          f"loss {case['noisy_label_loss']:.6g}  peak {case['peak_rss_mb']:.0f} MB", flush=True)


if __name__ == "__main__":
    main()
