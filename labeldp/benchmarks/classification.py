"""``labeldp bench classification``: label-DP classification protocols on scikit-learn's bundled 8x8 digits,
through a real labels-party server on loopback: RR (LP-1ST), multi-stage RRWithPrior (LP-2ST, LP-3ST) and the
subset-selection randomizer with its unbiased loss, against a non-private model; mean ± sd over seeds."""

from __future__ import annotations

import contextlib
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from features_party.client import LabelsPartyClient
from features_party.multistage import train_multistage
from features_party.train import TrainConfig, train

METHODS = ["non-private", "rr (LP-1ST)", "LP-2ST", "LP-3ST", "subset", "cluster priors"]
CLUSTERS = 10  # k-means clusters of the (public) features for the cluster-prior method
CLUSTER_PRIOR_SHARE = 0.1  # ε_p = ε/10 for the per-cluster discrete-Laplace histograms


@contextlib.contextmanager
def labels_party_server(workdir: Path):
    """A real labels-party service (uvicorn, SQLite) on a free loopback port; yields (url, admin, consumer)."""
    import socket

    import uvicorn

    from labels_party.api import create_app
    from labels_party.auth import create_key
    from labels_party.service import make_context

    ctx = make_context(f"sqlite:///{workdir}/labels.db", workdir / "data")
    with ctx.sessions() as session, session.begin():
        admin, consumer = create_key(session, "owner", "admin"), create_key(session, "learner", "consumer")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(ctx), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}", admin, consumer
    finally:
        server.should_exit = True
        thread.join(timeout=20)


def load_digits_arrays():
    """scikit-learn's bundled 8x8 digits: (features in [0, 1], labels, example ids, empty categorical block)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    y = digits.target.astype(np.int64)
    return ((digits.data / 16.0).astype(np.float32), y, np.array([f"d{i}" for i in range(len(y))]),
            np.zeros((len(y), 0), dtype=np.int32))


def run_classification_bench(epsilons: list[float], seeds: int, out: str | Path, *, epochs: int = 40,
                             progress: bool = True) -> pd.DataFrame:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    x, y, ids, no_categorical = load_digits_arrays()
    config = TrainConfig(loss="cross_entropy", hidden=(64,), learning_rate=3e-3, l2=1e-4, batch_size=128,
                         epochs=epochs, patience=8)
    rows = []
    jobs = [(seed, eps, m) for seed in range(seeds) for eps in epsilons for m in METHODS[1:]]
    with tempfile.TemporaryDirectory(prefix="labeldp-bench-cls-") as tmp, \
            labels_party_server(Path(tmp)) as (url, admin, consumer):
        datasets = {}
        with LabelsPartyClient(url, admin) as owner:
            for seed in range(seeds):
                dataset = owner.create_dataset(name=f"digits-{seed}", label_kind="classes", num_classes=10,
                                               epsilon_total=(len(METHODS) - 1) * sum(epsilons))
                owner.upload_labels(dataset.id, ids, y.astype(float))
                owner.grant(dataset.id, "learner")
                datasets[seed] = dataset.id
        splits = {s: np.random.default_rng(500 + s).permutation(len(y)) for s in range(seeds)}
        for seed in range(seeds):
            test, fit = splits[seed][: len(y) // 5], splits[seed][len(y) // 5:]
            model = train(config, x[fit], no_categorical[fit], y[fit], vocab_sizes=(), num_classes=10)
            rows.append({"method": "non-private", "epsilon": None, "seed": seed,
                         "accuracy": _accuracy(model, x[test], y[test]), "mean_k": None})
        with LabelsPartyClient(url, consumer) as client:
            for seed, epsilon, method in tqdm(jobs, desc="bench classification", disable=not progress):
                test, fit = splits[seed][: len(y) // 5], splits[seed][len(y) // 5:]
                row = {"method": method, "epsilon": epsilon, "seed": seed, "mean_k": None}
                if method == "cluster priors":
                    from sklearn.cluster import KMeans

                    groups = KMeans(n_clusters=CLUSTERS, n_init=4, random_state=seed).fit_predict(x[fit])
                    release = client.request_group_release(
                        datasets[seed], ids[fit], groups, "rr-with-prior", epsilon, CLUSTER_PRIOR_SHARE * epsilon,
                        idempotency_key=f"clusters-{seed}-{epsilon}")
                    table = client.download_labels(release.id).to_pandas().set_index("example_id")
                    noisy = table.loc[ids[fit], "label"].to_numpy().astype(np.int64)
                    model = train(config, x[fit], no_categorical[fit], noisy, vocab_sizes=(), num_classes=10)
                    row["certified_epsilon"] = release.certified_epsilon
                elif method == "subset":
                    release = client.request_release(datasets[seed], {
                        "mechanism": "subset", "epsilon": epsilon, "example_ids": ids[fit].tolist()},
                        idempotency_key=f"subset-{seed}-{epsilon}")
                    table = client.download_labels(release.id).to_pandas().set_index("example_id")
                    sets = table.loc[ids[fit], [f"in_class_{k}" for k in range(10)]].to_numpy(dtype=float)
                    p, q = release.description["p_true"], release.description["p_other"]
                    model = train(TrainConfig(**{**config.__dict__, "loss": "subset"}), x[fit], no_categorical[fit],
                                  (sets - q) / (p - q), vocab_sizes=(), num_classes=10)
                    row["certified_epsilon"] = release.certified_epsilon
                else:
                    stages = {"rr (LP-1ST)": 1, "LP-2ST": 2, "LP-3ST": 3}[method]
                    model, reports = train_multistage(
                        client, datasets[seed], ids[fit], x[fit], no_categorical[fit], vocab_sizes=(),
                        num_classes=10, epsilon=epsilon, stages=stages, config=config, seed=seed)
                    row["mean_k"] = reports[-1].mean_k
                    row["certified_epsilon"] = max(r.certified_epsilon for r in reports)
                row["accuracy"] = _accuracy(model, x[test], y[test])
                rows.append(row)
                pd.DataFrame(rows).to_csv(out / "runs.csv", index=False)
        with LabelsPartyClient(url, admin) as owner:
            budgets = [owner.budget(datasets[s]) for s in range(seeds)]
            audit = owner.audit(datasets[0])
    runs = pd.DataFrame(rows)
    runs.to_csv(out / "runs.csv", index=False)
    _summary(runs, epsilons, out, budgets, audit)
    return runs


def _accuracy(model, x, y) -> float:
    return float(np.mean(np.argmax(model.predict(x, np.zeros((len(x), 0), np.int32)), axis=1) == y))


def _summary(runs: pd.DataFrame, epsilons: list[float], out: Path, budgets, audit) -> None:
    baseline = runs[runs.method == "non-private"]["accuracy"]
    stats = runs[runs.method != "non-private"].groupby(["method", "epsilon"])["accuracy"].agg(["mean", "std"])
    lines = ["# Label-DP classification on scikit-learn digits (10 classes, 1438 train / 359 test)", "",
             f"Test accuracy, mean ± sd over {runs.seed.nunique()} seeds. Non-private: {baseline.mean():.3f} ± "
             f"{baseline.std(ddof=0):.3f}. Every private method releases each training example's label once at ε "
             "(LP-MST: one stage per example), through a real labels-party server. Cluster priors: k-means "
             f"({CLUSTERS} clusters) on the features, a discrete-Laplace label histogram per cluster at "
             f"ε_p = ε/{round(1 / CLUSTER_PRIOR_SHARE)}, RRWithPrior per cluster at the rest.", "",
             "| method | " + " | ".join(f"ε={e:g}" for e in epsilons) + " |", "|---|" + "---|" * len(epsilons)]
    for method in METHODS[1:]:
        cells = []
        for epsilon in epsilons:
            mean, std = stats.loc[(method, epsilon)]
            cells.append(f"{mean:.3f} ± {0 if np.isnan(std) else std:.3f}")
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    spent = ", ".join(f"{b.epsilon_spent:g}/{b.epsilon_total:g}" for b in budgets)
    lines += ["", f"Budget per seed's dataset (spent/total, max over examples): {spent}. Audit of seed 0: "
              f"{len(audit.events)} events, chain valid: {audit.chain_valid}."]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
