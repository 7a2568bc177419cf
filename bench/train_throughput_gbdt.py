"""Training time per 10⁶ rows for each learner of the trainer: gradient-boosted trees (``features_party.learn.gbdt``,
XGBoost ``hist``, the job defaults: depth 6, learning rate 0.05, subsample 0.8, min_child_weight 10) and the
paper-size MLP (``features_party.learn.train``, hidden (64, 32), embeddings of dimension 4, batch 1024), on the
synthetic table of bench/train_throughput.py (4 numeric and 3 categorical features, a nonlinear target with noise
variance 0.25), on whatever device each learner picks (the same choice: CUDA when JAX sees a GPU).

Run: `.venv/bin/python bench/train_throughput_gbdt.py [--n 1000000] [--rounds 200] [--epochs 4] [--threads T]
[--json]`

* trees: ``rounds`` boosting rounds with early stopping out of reach; seconds per round (median of the rounds after
  the first) and per whole fit (with building the binned matrices), each per 10⁶ training rows, and the rates of
  the trainer's size unit (``work_units_per_second``: ``gbdt.work``, counted in the MLP's unit, parameters ×
  examples) and of the raw tree unit (``tree_units_per_second``: a row's feature binned at one depth) —
  ``max_job_size`` bounds both learners, so the two work rates say how long a job at the limit runs with each.
  ``--threads`` (default: every core, as a one-worker trainer gives a job) shows what sharing the cores costs.
* MLP: seconds per epoch (median after the compiling first epoch) and per ``epochs``-epoch fit, per 10⁶ rows, and
  parameter-example updates per second.
* Both: test MSE on an independent test set, so that speed is not bought with a worse fit.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
import xgboost as xgb

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from train_throughput import NUM_NUMERIC, VOCAB_SIZES, synthetic  # noqa: E402

from features_party.learn import gbdt  # noqa: E402
from features_party.learn.train import TrainConfig, device_summary, train  # noqa: E402
from shared import models  # noqa: E402

MILLION = 1e6


def measure_trees(n: int, rounds: int, test_n: int, threads: int) -> dict:
    numeric, categorical, target = synthetic(n, 0)
    config = gbdt.GbdtConfig(n_estimators=rounds, early_stopping_rounds=rounds)  # the job defaults otherwise
    started = time.perf_counter()
    result = gbdt.train_gbdt(config, numeric, categorical, target, threads=threads)
    total = time.perf_counter() - started
    fit_rows = n - int(round(config.validation_fraction * n))
    per_round = float(np.median([r["seconds"] for r in result.history[1:]] or [result.history[0]["seconds"]]))
    features = NUM_NUMERIC + len(VOCAB_SIZES)
    test_numeric, test_categorical, test_target = synthetic(test_n, 1)
    return {"rounds": len(result.history), "best_round": result.best_epoch, "fit_rows": fit_rows,
            "seconds_per_round_per_million_rows": per_round / fit_rows * MILLION,
            "fit_seconds": total, "fit_seconds_per_million_rows": total / fit_rows * MILLION,
            "work_units_per_second": gbdt.work(1, config.max_depth, 1, fit_rows, features) / per_round,
            "tree_units_per_second": gbdt.work(1, config.max_depth, 1, fit_rows, features) / gbdt.UNIT_COST
                                     / per_round, "threads": threads,
            "test_mse": float(np.mean((result.predict(test_numeric, test_categorical) - test_target) ** 2)),
            "device": result.device, "config": config.__dict__}


def measure_mlp(n: int, epochs: int, test_n: int) -> dict:
    numeric, categorical, target = synthetic(n, 0)
    config = TrainConfig(hidden=(64, 32), embed_dim=4, batch_size=1024, epochs=epochs, patience=epochs, seed=0)
    started = time.perf_counter()
    result = train(config, numeric, categorical, target, vocab_sizes=VOCAB_SIZES)
    total = time.perf_counter() - started
    fit_rows = n - int(round(config.validation_fraction * n))
    per_epoch = float(np.median([r["seconds"] for r in result.history[1:]] or [result.history[0]["seconds"]]))
    test_numeric, test_categorical, test_target = synthetic(test_n, 1)
    return {"epochs": len(result.history), "fit_rows": fit_rows,
            "seconds_per_epoch_per_million_rows": per_epoch / fit_rows * MILLION,
            "first_epoch_seconds": result.history[0]["seconds"],
            "fit_seconds": total, "fit_seconds_per_million_rows": total / fit_rows * MILLION,
            "work_units_per_second": models.num_params(result.spec) * fit_rows / per_epoch,
            "test_mse": float(np.mean((result.predict(test_numeric, test_categorical) - test_target) ** 2)),
            "device": device_summary()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--test-n", type=int, default=100_000)
    parser.add_argument("--threads", type=int, default=gbdt.threads_per_job(1),
                        help="XGBoost's CPU threads (default: a one-worker trainer's, every core)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    figures = {"benchmark": "train_throughput_gbdt", "command": "python " + " ".join(sys.argv), "n": args.n,
               "test_n": args.test_n, "noise_variance": 0.25, "xgboost": xgb.__version__,
               "machine": platform.processor() or platform.machine(),
               "gbdt": measure_trees(args.n, args.rounds, args.test_n, args.threads),
               "mlp": measure_mlp(args.n, args.epochs, args.test_n)}
    if args.json:
        print(json.dumps(figures))
        return
    trees, mlp = figures["gbdt"], figures["mlp"]
    print(f"n={args.n:,} ({trees['fit_rows']:,} fitted), test MSE against noise variance 0.25")
    print(f"  gbdt ({trees['device']}): {trees['seconds_per_round_per_million_rows']:.3f} s per round per 10^6 rows; "
          f"{trees['rounds']} rounds {trees['fit_seconds_per_million_rows']:.1f} s per 10^6 rows; "
          f"{trees['work_units_per_second']:.3g} size units/s ({trees['threads']} threads); "
          f"test MSE {trees['test_mse']:.4f}")
    print(f"  mlp ({mlp['device']}): {mlp['seconds_per_epoch_per_million_rows']:.3f} s per epoch per 10^6 rows; "
          f"{mlp['epochs']} epochs {mlp['fit_seconds_per_million_rows']:.1f} s per 10^6 rows; "
          f"{mlp['work_units_per_second']:.3g} size units/s; test MSE {mlp['test_mse']:.4f}")


if __name__ == "__main__":
    main()
