"""The trainer's memory stays flat over many jobs: 30 jobs on 10⁵ examples each, against a real labels party,
with the trainer as its own process (`labeldp features serve`), resident memory read from /proc."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from labeldp.local_services import free_port, serve_in_thread, serve_process
from labels_party.http.api import create_app as create_labels
from labels_party.http.auth import create_key
from labels_party.runtime.context import make_context

MB = 1 << 20
N = 100_000
JOBS = 30  # 25 after the warm-up: a leak of 4 MB a job crosses the 100 MB bound
WARM_UP = 5  # JAX compiles the training step and XLA allocates its pools in the first jobs


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@contextlib.contextmanager
def trainer_server(tmp_path, labels_url: str):
    """`labeldp features serve` as its own process; yields (base url, pid, admin key)."""
    env = {**os.environ, "LABELDP_TRAINER_DATABASE_URL": f"sqlite:///{tmp_path}/trainer.db",
           "LABELDP_TRAINER_DATA_DIR": str(tmp_path / "trainer"),
           "LABELDP_TRAINER_LABELS_PARTIES": json.dumps({"office": labels_url})}
    cli = [sys.executable, "-m", "labeldp", "features"]
    key = subprocess.run(cli + ["create-key", "--org", "publisher", "--role", "admin"], env=env,
                         capture_output=True, text=True, check=True).stdout.strip()
    port = free_port()
    with serve_process(cli + ["serve", "--port", str(port)], f"http://127.0.0.1:{port}", env=env) as server:
        yield f"http://127.0.0.1:{port}", server.pid, key


@pytest.mark.slow
def test_memory_stays_flat_over_thirty_jobs_of_a_hundred_thousand_rows(tmp_path):
    rng = np.random.default_rng(11)
    x = rng.normal(size=N)
    labels = np.clip(np.rint(5 + 2 * x + rng.normal(size=N)), 0, 9).astype(int)
    ids = [f"u{i}" for i in range(N)]
    ctx = make_context(f"sqlite:///{tmp_path}/labels.db", tmp_path / "labels")
    with ctx.sessions() as session, session.begin():
        admin = create_key(ctx.ledger, session, "office", "admin")
        consumer = create_key(ctx.ledger, session, "publisher", "consumer")
    owner = TestClient(create_labels(ctx), headers={"Authorization": f"Bearer {admin}"})
    dataset = owner.post("/v1/datasets", json={"name": "y", "label_kind": "integer", "min": 0, "max": 9,
                                               "epsilon_total": 100}).json()["id"]
    owner.put(f"/v1/datasets/{dataset}/labels", headers={"Content-Type": "text/csv"},
              content="example_id,label\n" + "\n".join(f"{i},{v}" for i, v in zip(ids, labels, strict=True)))
    owner.post(f"/v1/datasets/{dataset}/grants", json={"org": "publisher", "epsilon": 100})
    features = "example_id,x0\n" + "\n".join(f"{i},{v!r}" for i, v in zip(ids, x.tolist(), strict=True))
    job = {"features": "f", "api_key": consumer, "dataset_id": dataset, "numeric": ["x0"],
           "release": {"mechanism": "rr", "epsilon": 1.0},
           "train": {"hidden": [], "epochs": 1, "batch_size": 1024, "patience": 1}}
    with serve_in_thread(create_labels(ctx)) as labels_url, trainer_server(tmp_path, labels_url) as (url, pid, key):
        http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=120)
        assert http.put("/v1/features/f", content=features, headers={"Content-Type": "text/csv"}).status_code == 200
        resident = []
        for _ in range(JOBS):
            created = http.post("/v1/jobs", json=job)
            assert created.status_code == 202, created.text
            for _ in range(1200):
                view = http.get(f"/v1/jobs/{created.json()['id']}").json()
                if view["status"] in ("succeeded", "failed"):
                    break
                time.sleep(0.05)
            assert view["status"] == "succeeded", view
            assert len(json.dumps(view)) < 8192  # compact: no example ids
            assert len(http.get(f"/v1/jobs/{view['id']}/predictions").content) > N * 10  # every row, as CSV
            resident.append(_rss(pid))
    growth = resident[-1] - resident[WARM_UP - 1]
    print(f"trainer RSS after job {WARM_UP}: {resident[WARM_UP - 1] / MB:.0f} MB, after job {JOBS}: "
          f"{resident[-1] / MB:.0f} MB (growth {growth / MB:.1f} MB, max {max(resident) / MB:.0f} MB)")
    assert growth < 100 * MB
    assert owner.get(f"/v1/datasets/{dataset}/budget").json()["epsilon_spent"] == JOBS * 1.0
