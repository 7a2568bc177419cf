"""Issue 39's evidence from ``labeldp bench utility`` runs that include ``auto``: per table and ε, auto's true test
loss (error rate for classes) against the constant predictor's in every seed, and against the best fixed
(mechanism, learner) in hindsight on average; one table (``evidence.md``), one JSON document (``--json``), one
figure (``evidence.png``: auto / constant per seed, auto / best fixed per cell, against ε). With ``--model``, the
evidence of one learner: auto restricted to it (``bench utility --model mlp``) against the fixed runs of that learner.

    .venv/bin/python bench/auto_evidence.py --runs DIR [DIR ...] --out docs/results/auto [--model mlp|gbdt] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from labeldp.benchmarks.comparison import AUTO_BOUND, AUTO_GAP  # noqa: E402


def _losses(rows: pd.DataFrame) -> pd.Series:
    """The compared loss of each run: the test loss, or the error rate (1 − accuracy) for classes."""
    if "accuracy" in rows and rows["accuracy"].notna().any() and rows["test_loss"].isna().all():
        return 1 - rows["accuracy"].astype(float)
    return rows["test_loss"].astype(float)


def cells(runs: pd.DataFrame) -> list[dict]:
    out = []
    for dataset, part in runs.groupby("dataset", sort=False):
        reference = part[part.mechanism == "non-private"].drop_duplicates("seed").set_index("seed")
        classes = "accuracy" in part and part["accuracy"].notna().any() and part["test_loss"].isna().all()
        constant = (1 - reference["constant_test_loss"].astype(float)) if classes \
            else reference["constant_test_loss"].astype(float)
        private = part[part.mechanism != "non-private"].assign(loss=lambda f: _losses(f).to_numpy())
        for epsilon, at in private.groupby("epsilon"):
            auto = at[at.mechanism == "auto"].set_index("seed")["loss"]
            fixed = at[at.mechanism != "auto"].groupby(["mechanism", "model"])["loss"].mean()
            if auto.empty:
                continue
            best_mechanism, best_model, best = None, None, None  # no fixed run at this ε: the constant bar only
            if not fixed.empty:
                (best_mechanism, best_model), best = fixed.idxmin(), float(fixed.min())
            ratios = auto / constant.reindex(auto.index)
            out.append({"dataset": dataset, "epsilon": float(epsilon), "seeds": int(len(auto)),
                        "metric": "error rate" if classes else "test loss",
                        "auto": float(auto.mean()), "constant": float(constant.reindex(auto.index).mean()),
                        "worst_seed_ratio_to_constant": float(ratios.max()),
                        "best_fixed": f"{best_mechanism} ({best_model})" if best is not None else None,
                        "best_fixed_loss": best,
                        "ratio_to_best_fixed": float(auto.mean() / best) if best is not None else None,
                        "auto_choices": at[at.mechanism == "auto"]["auto_choice"].fillna("—").value_counts().to_dict()
                        if "auto_choice" in at else {}})
    return out


KEY = ["dataset", "mechanism", "model", "epsilon", "seed"]


def combined(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Runs of several directories, later ones first: a run of the same (table, mechanism, learner, ε, seed)
    replaces an earlier one, and a table's auto runs in a later directory replace all its earlier auto runs (auto
    run again after a change to how it chooses is judged as it now is, not mixed with what it was)."""
    out = pd.DataFrame()
    for frame in frames:
        if not out.empty:
            rerun = set(frame.loc[frame.mechanism == "auto", "dataset"])
            out = out[~((out.mechanism == "auto") & out.dataset.isin(rerun))]
        out = pd.concat([out, frame], ignore_index=True)
    return out.drop_duplicates(KEY, keep="last").reset_index(drop=True)


def summary(found: list[dict]) -> dict:
    worst = max(c["worst_seed_ratio_to_constant"] for c in found)
    compared = [c["ratio_to_best_fixed"] for c in found if c["ratio_to_best_fixed"] is not None]
    gap = float(np.mean(compared)) if compared else float("nan")
    return {"cells": len(found), "cells_with_fixed_runs": len(compared),
            "worst_seed_ratio_to_constant": worst, "bound": AUTO_BOUND,
            "within_bound_every_seed": bool(worst <= AUTO_BOUND), "mean_ratio_to_best_fixed": gap,
            "gap_goal": AUTO_GAP, "within_gap_on_average": bool(gap <= AUTO_GAP),
            "cells_over_bound": [f"{c['dataset']} ε={c['epsilon']:g}" for c in found
                                 if c["worst_seed_ratio_to_constant"] > AUTO_BOUND]}


def markdown(found: list[dict], totals: dict, model: str | None = None) -> str:
    learner = f", the {model} learner only (auto restricted to it, fixed runs of it)" if model else ""
    lines = [f"# auto against the constant and the best fixed choice{learner}", "",
             f"{totals['cells']} cells (table × ε), each over its seeds. Worst seed's auto / constant: "
             f"{totals['worst_seed_ratio_to_constant']:.3f} (bound {AUTO_BOUND}: "
             f"{'met' if totals['within_bound_every_seed'] else 'NOT met'}); mean over the "
             f"{totals['cells_with_fixed_runs']} cells with fixed runs of auto / best fixed in "
             f"hindsight: {totals['mean_ratio_to_best_fixed']:.3f} (goal ≤ {AUTO_GAP}: "
             f"{'met' if totals['within_gap_on_average'] else 'NOT met'}).", "",
             "| table | ε | metric | auto | constant | worst seed auto/constant | best fixed (in hindsight) | "
             "auto/best | auto chose |", "|---|---|---|---|---|---|---|---|---|"]
    for c in found:
        chose = "; ".join(f"{k} ×{v}" for k, v in c["auto_choices"].items())
        best = "no fixed run | —" if c["best_fixed"] is None else \
            f"{c['best_fixed']}: {c['best_fixed_loss']:.4g} | {c['ratio_to_best_fixed']:.3f}"
        lines.append(f"| {c['dataset']} | {c['epsilon']:g} | {c['metric']} | {c['auto']:.4g} | {c['constant']:.4g} | "
                     f"{c['worst_seed_ratio_to_constant']:.3f} | {best} | {chose} |")
    return "\n".join(lines) + "\n"


def figure(found: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from labeldp.report import line_styles

    frame = pd.DataFrame(found)
    styles = line_styles(frame["dataset"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for dataset, rows in frame.groupby("dataset", sort=False):
        rows = rows.sort_values("epsilon")
        left.plot(rows["epsilon"], rows["worst_seed_ratio_to_constant"], label=dataset, **styles[dataset])
        compared = rows[rows["ratio_to_best_fixed"].notna()]
        right.plot(compared["epsilon"], compared["ratio_to_best_fixed"], label=dataset, **styles[dataset])
    left.axhline(AUTO_BOUND, color="gray", linestyle=":", linewidth=2, label=f"bound {AUTO_BOUND}")
    right.axhline(AUTO_GAP, color="gray", linestyle=":", linewidth=2, label=f"goal {AUTO_GAP} (on average)")
    right.axhline(1.0, color="black", linestyle="--", linewidth=1, label="the best fixed choice")
    ticks = sorted(frame["epsilon"].unique())
    for axis in (left, right):
        axis.set_xscale("log")
        axis.set_xticks(ticks, [f"{e:g}" for e in ticks])
        axis.minorticks_off()
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
        axis.set_xlabel("ε")
    left.set(ylabel="worst seed: auto / constant", title="auto against the constant (every seed)")
    right.set(ylabel="auto / best fixed (means)", title="auto against the best fixed choice in hindsight")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", nargs="+", required=True, help="bench utility output directories (runs.csv)")
    parser.add_argument("--out", required=True, help="where evidence.md, evidence.json and evidence.png go")
    parser.add_argument("--model", choices=("mlp", "gbdt"),
                        help="one learner's evidence: only its private runs (auto and fixed) are compared")
    parser.add_argument("--json", action="store_true", help="print the evidence as one JSON document")
    args = parser.parse_args(argv)
    runs = combined([pd.read_csv(Path(d) / "runs.csv") for d in args.runs])
    if args.model:  # the constant comes from the non-private reference, whichever learner it ran with
        runs = runs[(runs.mechanism == "non-private") | (runs.model == args.model)]
    found = cells(runs)
    if not found:
        print("no cell with auto and the non-private reference in those runs", file=sys.stderr)
        return 1
    totals = summary(found)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    document = {"summary": totals, "cells": found, "runs": [str(d) for d in args.runs], "model": args.model}
    (out / "evidence.json").write_text(json.dumps(document, indent=1) + "\n")
    (out / "evidence.md").write_text(markdown(found, totals, args.model))
    figure(found, out / "evidence.png")
    print(json.dumps(document) if args.json else markdown(found, totals, args.model))
    return 0


if __name__ == "__main__":
    sys.exit(main())
