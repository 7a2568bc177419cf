"""What ``labeldp bench utility`` can be asked for — its mechanisms by name and its defaults — in a module that
imports nothing, so that the command's ``--help`` lists them without loading the benchmark (JAX, the solvers)."""

from __future__ import annotations

from typing import NamedTuple

# The bundled datasets by name (labeldp.benchmarks.utility.DATASETS defines them; a test keeps the two equal).
DATASET_NAMES = ("psid-weeks", "doctor-contacts", "hours-worked", "cps-wages", "diamond-prices", "cps-earnings",
                 "labour-hours", "household-wealth", "storm-status")

# Each benchmark mechanism as the release fields a job asks for (ε added per run); None: the non-private model.
# "group_release": the publisher first requests a group release (one prior + randomizer per k-means cluster of
# the features) and the job trains on it; "protocol"/"stages" are job fields (multi-stage RRWithPrior).
MECHANISMS = {
    "non-private": None,
    "laplace": {"mechanism": "laplace"},
    "laplace-clipped": {"mechanism": "laplace", "clip": True},
    "staircase": {"mechanism": "staircase"},
    "staircase-clipped": {"mechanism": "staircase", "clip": True},
    "rr-on-bins": {"mechanism": "rr-on-bins"},
    "opt-unbiased": {"mechanism": "opt-unbiased"},
    "opt-unbiased-mesh": {"mechanism": "opt-unbiased", "solver": "mesh"},  # Algorithm 1 on a 2|Y| grid, to compare
    "opt-unbiased-groups": {"mechanism": "opt-unbiased", "group_release": True},
    "rp-with-prior": {"mechanism": "rp-with-prior"},  # RPWithPrior (Liu & Huang) on the noisy global prior
    "auto": {"mechanism": "auto"},  # the trainer chooses mechanism, learner and regularization (features_party/auto)
}
# Class labels: the protocols of `labeldp bench classification` (labeldp.benchmarks.classification.METHODS).
CLASSIFICATION_MECHANISMS = {
    "non-private": None,
    "rr": {"mechanism": "rr"},  # LP-1ST
    "rr-with-prior": {"mechanism": "rr-with-prior"},  # RRWithPrior on the labels party's noisy global prior
    "lp-2st": {"mechanism": "rr", "protocol": "lp-mst", "stages": 2},
    "lp-3st": {"mechanism": "rr", "protocol": "lp-mst", "stages": 3},
    "subset": {"mechanism": "subset"},
    "cluster-priors": {"mechanism": "rr-with-prior", "group_release": True},
    "block-rr": {"mechanism": "block-rr"},  # BlockRR (Liu & Ding) on the noisy global prior
    "alibi": {"mechanism": "alibi"},  # ALIBI (Malek et al.): noisy one-hot vectors, soft labels (the MLP only)
    "auto": {"mechanism": "auto"},
}
AUTO = "auto"  # also the runs.csv model of an auto job that chose between both learners

# The learners a job may train (features_party/schemas.py TrainOptions.model), as the bench names them in runs.csv and
# summary.md; the first is the default. Trees take no label sets: a subset release needs the MLP's subset loss.
MODELS = {"mlp": "the JAX MLP/GLM", "gbdt": "XGBoost gradient-boosted trees with the job defaults of train.gbdt"}
DEFAULT_MODEL = "mlp"
NO_TREES = ("subset", "alibi")  # mechanisms whose releases no tree objective takes


class Grid(NamedTuple):
    epsilons: tuple[float, ...]
    seeds: int
    epochs: int


DEFAULT = Grid(epsilons=(0.25, 0.5, 1.0, 2.0, 4.0, 8.0), seeds=10, epochs=30)
DEFAULT_EPOCHS = DEFAULT.epochs
QUICK = Grid(epsilons=(1.0, 2.0), seeds=2, epochs=8)  # --quick: a smoke run


# The plan's warnings (labeldp.benchmarks.plan): named, never acted on.
MAX_LEVELS = 1000  # a categorical column with more levels ...
MAX_LEVEL_SHARE = 0.05  # ... or more levels than this share of the rows: few rows per level, likely an identifier
LEAK_ASSOCIATION = 0.95  # a numeric column this associated with the label may be computed from it
