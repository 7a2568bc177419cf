"""Paired win counts of the published peers (issue 41) against the product's mechanisms, from `labeldp bench utility`
runs: for each table, learner, ε and (peer, baseline) pair, in how many seeds the peer's model was better on the
true test labels (lower MSE for numbers, higher accuracy for classes), and the mean of each.

Run: `.venv/bin/python bench/peer_wins.py --runs DIR [DIR ...] --peers rp-with-prior,block-rr,alibi [--json]`
(each DIR holds a runs.csv). The markdown goes to stdout; --json prints one JSON document instead.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pandas as pd


def wins(frame: pd.DataFrame, peers: list[str]) -> list[dict]:
    rows = []
    frame = frame[frame["mechanism"] != "non-private"]
    for (dataset, model), part in frame.groupby(["dataset", "model"]):
        classes = "accuracy" in part and part["accuracy"].notna().any()
        metric = "accuracy" if classes else "test_loss"
        better = (lambda a, b: a > b) if classes else (lambda a, b: a < b)
        by = part.pivot_table(index=["epsilon", "seed"], columns="mechanism", values=metric)
        constant = part.groupby("epsilon")["constant_test_loss"].mean()
        for peer in (p for p in peers if p in by.columns):
            for baseline in (b for b in by.columns if b not in peers and b != "auto"):
                for epsilon, cell in by[[peer, baseline]].dropna().groupby(level="epsilon"):
                    rows.append({"dataset": dataset, "model": model, "metric": metric, "epsilon": float(epsilon),
                                 "peer": peer, "baseline": baseline, "seeds": len(cell),
                                 "peer_wins": int(sum(better(a, b) for a, b in zip(cell[peer], cell[baseline],
                                                                                     strict=True))),
                                 "peer_mean": float(cell[peer].mean()), "baseline_mean": float(cell[baseline].mean()),
                                 "constant": None if classes else float(constant.get(epsilon, math.nan))})
    return rows


def markdown(rows: list[dict]) -> str:
    lines = []
    frame = pd.DataFrame(rows)
    for (dataset, model, peer), part in frame.groupby(["dataset", "model", "peer"], sort=False):
        metric = part["metric"].iloc[0]
        epsilons = sorted(part["epsilon"].unique())
        lines += [f"### {dataset}, {model}: {peer} against each ({metric}; wins of {peer} over the seeds, and the two "
                  "means)", "", "| against | " + " | ".join(f"ε={e:g}" for e in epsilons) + " |",
                  "|---|" + "---|" * len(epsilons)]
        for baseline, rows_b in part.groupby("baseline", sort=False):
            cells = []
            for epsilon in epsilons:
                row = rows_b[rows_b["epsilon"] == epsilon]
                if row.empty:
                    cells.append("")
                    continue
                r = row.iloc[0]
                mark = "**" if r["peer_wins"] == r["seeds"] else ""
                cells.append(f"{mark}{r['peer_wins']}/{r['seeds']}{mark} "
                             f"({r['peer_mean']:.4g} vs {r['baseline_mean']:.4g})")
            lines.append(f"| {baseline} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", nargs="+", required=True)
    parser.add_argument("--peers", default="rp-with-prior,block-rr,alibi,pate-fm")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    frame = pd.concat([pd.read_csv(Path(d) / "runs.csv") for d in args.runs], ignore_index=True)
    rows = wins(frame, args.peers.split(","))
    print(json.dumps({"benchmark": "peer_wins", "runs": args.runs, "rows": rows}) if args.json else markdown(rows))


if __name__ == "__main__":
    main()
