"""The demo's classification round: K = 10 classes from scikit-learn's bundled 8x8 digits (no network), released
and trained on through the same two services as the regression round, with the protocols of
``labeldp bench classification`` (:mod:`labeldp.benchmarks.classification`, reused, not copied):

* **RR** — randomized response over the 10 classes (LP-1ST: one stage);
* **RRWithPrior** — RRWithPrior with cluster priors: the publisher groups its training examples by k-means on the
  (public) pixels, the office answers one group release (a discrete-Laplace label histogram per cluster at ε/10,
  RRWithPrior per cluster at the rest) and a trainer job trains on it;
* **LP-2ST** — two stages: RR on half the examples, a model, then RRWithPrior with that model's softmax as each
  remaining example's prior (one release per stage, disjoint halves: ε per example).

The office creates a second dataset (``classes``, 10 classes) on the same labels service, uploads every digit's
class and grants the publisher; every release covers training examples only, so the 20 % held out are never
released, and the demo scores the predictions on their true classes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from labeldp import references, report
from labeldp.benchmarks.classification import ClassTable, non_private, private_run, register_table, train_config
from labeldp.benchmarks.parties import Parties

MECHANISMS = {"RR": "rr (LP-1ST)", "RRWithPrior": "cluster priors", "LP-2ST": "LP-2ST"}  # demo name: bench method
EPSILONS = [1.0, 2.0, 4.0]
QUICK_EPSILONS = [1.0, 4.0]
NUM_CLASSES = 10
SEED = 0  # one split and one training seed; the releases draw from the labels party's cryptographic source
EPOCHS, QUICK_EPOCHS = 25, 15  # digits jobs stop early (patience 8); few run past 25 epochs
PLOT = "classification_accuracy_vs_epsilon.png"
RESULTS = "classification.json"


@dataclass(frozen=True)
class ClassificationRound:
    rows: list[dict]  # one per mechanism and ε, then the non-private reference (epsilon None)
    events: list[dict]  # the digits dataset's privacy events (the labels party's audit), in order
    chain_valid: bool
    epsilon_spent: float  # the labels party's budget: the most any example has spent
    epsilon_total: float
    epsilons: list[float]
    num_train: int
    num_test: int
    dataset_id: str

    @property
    def private(self) -> list[dict]:
        return [r for r in self.rows if r["epsilon"] is not None]

    @property
    def reference(self) -> dict:
        return next(r for r in self.rows if r["epsilon"] is None)

    @property
    def yardsticks(self) -> references.Yardsticks:
        """The non-private reference and the mean predictor (the training classes' majority) on the round's
        split, computed here from the true classes (the demo plays both parties)."""
        majority = ClassTable.digits().majority_accuracy(SEED)
        return references.Yardsticks((self.reference["test_accuracy"],), (majority,), higher_is_better=True)

    @property
    def charged_per_example(self) -> float:
        """Σ over the events of charge × examples covered / training examples: ε per training example when every
        release covers all of them or (LP-2ST's stages) a partition of them — less what LP-2ST's uncharged
        examples (a prior keeping one class) would have cost."""
        return sum(e["charge"] * e["examples_covered"] for e in self.events) / self.num_train


def non_private_reference(epochs: int) -> dict:
    """The non-private model (trained in this process on the true training classes: no party could) and its
    test accuracy, on the round's split."""
    return non_private(ClassTable.digits(), SEED, train_config(epochs))


def run_round(parties: Parties, epsilons: list[float], *, epochs: int,
              reference: Callable[[], dict] | None = None, dataset_name: str = "digits") -> ClassificationRound:
    """Every mechanism at every ε as trainer jobs over HTTP, then the non-private reference (``reference()``, or
    trained here), the labels party's audit and budget of the round's dataset."""
    digits = ClassTable.digits()
    fit, test = digits.split(SEED)
    config = train_config(epochs)
    total = len(MECHANISMS) * sum(epsilons)
    dataset_id = register_table(parties, dataset_name, digits, total)
    print(f"\nclassification: scikit-learn digits, {NUM_CLASSES} classes, {len(fit)} train / {len(test)} test; "
          f"labels party: dataset {dataset_id} with {len(digits.y)} labels, epsilon_total {total:g}", flush=True)
    with parties.trainer() as trainer:
        trainer.put_features("digits", digits.features())
    truth = pd.Series(digits.y, index=digits.ids)
    rows = []
    with parties.owner() as office:
        for epsilon in epsilons:
            for name, method in MECHANISMS.items():
                run = private_run(parties, dataset_id, digits, method, epsilon, SEED, config)
                released = pd.concat([office.download_labels(r).to_pandas() for r in run["release_ids"]])
                # LP-2ST's stage-2 examples whose prior keeps one class: neither charged nor released (their label
                # is that class, computed by the features party)
                uninformative = sum(int(office.get_release(r).description.get("uninformative_examples", 0))
                                    for r in run["release_ids"])
                label_accuracy = float(np.mean(np.rint(released["label"].to_numpy())
                                               == truth[released["example_id"]].to_numpy()))
                rows.append({"mechanism": name, "protocol": method, "epsilon": epsilon,
                             "test_accuracy": run["accuracy"], "released_label_accuracy": label_accuracy,
                             "certified_epsilon": run["certified_epsilon"], "mean_k": run["mean_k"],
                             "release_ids": run["release_ids"], "uninformative_examples": uninformative})
                print(f"  eps={epsilon:<4g} {name:<13} test accuracy {run['accuracy']:.3f}   released-label accuracy "
                      f"{label_accuracy:.3f}   certified eps {run['certified_epsilon']:.6f}", flush=True)
        accuracy = (reference() if reference else non_private(digits, SEED, config))["accuracy"]
        rows.append({"mechanism": "non-private", "protocol": None, "epsilon": None, "test_accuracy": accuracy,
                     "released_label_accuracy": None, "certified_epsilon": None, "mean_k": None, "release_ids": [],
                     "uninformative_examples": 0})
        print(f"  non-private       test accuracy {accuracy:.3f}", flush=True)
        audit, budget = office.audit(dataset_id), office.budget(dataset_id)
    events = [{"seq": e.seq, "release_id": e.record["release_id"], "mechanism": e.record["mechanism"],
               "epsilon_requested": e.record["epsilon_requested"], "charge": e.record["charge"],
               "examples_covered": e.record["examples_covered"]} for e in audit.events]
    charged = {e["release_id"]: e["charge"] * e["examples_covered"] / len(fit) for e in events}  # per example
    for row in rows:
        row["charged_epsilon_per_example"] = sum(charged[r] for r in row["release_ids"]) if row["epsilon"] else None
    return ClassificationRound(rows, events, audit.chain_valid, budget.epsilon_spent, budget.epsilon_total,
                               list(epsilons), len(fit), len(test), dataset_id)


def report_lines(result: ClassificationRound, out: Path) -> list[str]:
    """The round's section of ``results.md``; also writes ``classification.json`` and the accuracy plot."""
    (out / RESULTS).write_text(json.dumps({**asdict(result), "charged_per_example": result.charged_per_example},
                                          indent=2))
    plot(result, out / PLOT)
    test = {(r["mechanism"], r["epsilon"]): r["test_accuracy"] for r in result.private}
    labels = {(r["mechanism"], r["epsilon"]): r["released_label_accuracy"] for r in result.private}
    best = {e: max(test[(m, e)] for m in MECHANISMS) for e in result.epsilons}
    requested = len(MECHANISMS) * sum(result.epsilons)
    uncharged = sum(row.get("uninformative_examples", 0) for row in result.rows)
    refs = result.yardsticks
    warning = refs.warning(test, ".3f")
    return [f"# Classification round: test accuracy (scikit-learn digits, {NUM_CLASSES} classes, "
            f"{result.num_train} train / {result.num_test} test)", "",
            *refs.lines("test accuracy", ".3f"),
            f"Chance: {1 / NUM_CLASSES:.3f}. Higher is better; each cell is one job (LP-2ST: two releases) and one "
            "model, scored on the true held-out classes (bold: best at that ε; "
            f"{refs.legend('.3f')}). RRWithPrior: cluster priors (k-means on the pixels, label histogram per "
            "cluster at ε/10).", "",
            *report.epsilon_table(MECHANISMS, result.epsilons, lambda m, e: refs.mark(test[(m, e)], (
                f"**{test[(m, e)]:.3f}**" if test[(m, e)] == best[e] else f"{test[(m, e)]:.3f}"))),
            *([] if warning is None else ["", warning]),
            "", "Accuracy of the released training labels (what the features party trains on):", "",
            *report.epsilon_table(MECHANISMS, result.epsilons, lambda m, e: f"{labels[(m, e)]:.3f}"),
            "", "## Audit (classification)", "",
            f"{len(result.events)} privacy events on the digits dataset (RR and RRWithPrior: one release per ε; "
            f"LP-2ST: one per stage), hash chain valid: {result.chain_valid}. Charged per training example "
            f"(Σ charge × examples covered / {result.num_train}): {result.charged_per_example:g}, requested "
            f"{len(MECHANISMS)} mechanisms × Σε = {requested:g} ({uncharged} LP-2ST stage-2 examples whose prior "
            "kept one class were neither charged nor released); the labels party reports epsilon_spent = "
            f"{result.epsilon_spent:g} of {result.epsilon_total:g}. Test examples: never released."]


def plot(result: ClassificationRound, path: Path) -> None:
    """Test accuracy (left) and released-label accuracy (right) against ε, one line per mechanism; the non-private
    model and the majority class as reference lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    frame = pd.DataFrame(result.private)
    for name in MECHANISMS:
        rows = frame[frame["mechanism"] == name].sort_values("epsilon")
        left.plot(rows["epsilon"], rows["test_accuracy"], marker="o", label=name)
        right.plot(rows["epsilon"], rows["released_label_accuracy"], marker="o", label=name)
    report.reference_lines(left, result.yardsticks.plot_lines())
    for axis in (left, right):
        axis.axhline(1 / NUM_CLASSES, color="silver", linestyle="-.", label=f"chance (1/{NUM_CLASSES})")
        axis.set_xscale("log")
        axis.set_xticks(result.epsilons, [f"{e:g}" for e in result.epsilons])
        axis.minorticks_off()
        axis.set(xlabel="ε", ylim=(0, 1.02))
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    left.set(ylabel="test accuracy", title="Test accuracy vs ε (digits, 10 classes)")
    right.set(ylabel="released-label accuracy", title="released training labels")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
