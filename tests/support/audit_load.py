"""verify-audit in a loop while a live labels service charges releases (issue 28, item 9): every run must be
clean — one consistent snapshot per dataset, superseded budget files handled, pinned heads (the exported log, read
before each run) always contained in the chain. Used by tests/labels_party/api/test_audit_under_load.py (a small
count) and bench/audit_under_load.py (the issue's 1000 releases)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import numpy as np

from labeldp.local_services import serve_in_thread
from labels_party.http.api import create_app
from labels_party.http.auth import create_key
from labels_party.ledger import signing, verification
from labels_party.runtime.context import make_context
from labels_party.runtime.settings import LabelsSettings

NUM_LABELS = 500


def run(database_url: str, root: Path, releases: int, workers: int = 2) -> dict:
    """Charge ``releases`` releases (RR on random subsets, so that every charge supersedes budget files) from
    ``workers`` threads while verify-audit loops; returns the counts, timings and every problem seen."""
    key_file = root / "keys" / "audit.pem"
    public = signing.create_key_file(key_file)
    settings = LabelsSettings(database_url=database_url, data_dir=root / "data", audit_key_file=key_file,
                              audit_log_dir=root / "audit")
    ctx = make_context(settings=settings)
    log = root / "audit" / signing.LOG_NAME
    try:
        with ctx.sessions() as session, session.begin():
            admin = create_key(ctx.ledger, session, "hospital", "admin")
            consumer = create_key(ctx.ledger, session, "publisher", "consumer")
        with serve_in_thread(create_app(ctx)) as base:
            owner = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {admin}"}, timeout=120)
            dataset = owner.post("/v1/datasets", json={"name": "load", "label_kind": "integer", "min": 0, "max": 9,
                                                       "epsilon_total": 1000}).json()["id"]
            ids = [f"e{i}" for i in range(NUM_LABELS)]
            labels = "example_id,label\n" + "".join(f"{i},{n % 10}\n" for n, i in enumerate(ids))
            owner.put(f"/v1/datasets/{dataset}/labels", content=labels,
                      headers={"Content-Type": "text/csv"}).raise_for_status()
            owner.post(f"/v1/datasets/{dataset}/grants", json={"org": "publisher", "epsilon": 900}).raise_for_status()
            done = threading.Event()
            errors: list[str] = []
            runs: list[dict] = []

            def charge(worker: int) -> None:
                rng = np.random.default_rng(worker)
                client = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {consumer}"}, timeout=120)
                for n in range(worker, releases, workers):
                    chosen = sorted(rng.choice(NUM_LABELS, size=int(rng.integers(1, 50)), replace=False).tolist())
                    r = client.post(f"/v1/datasets/{dataset}/releases", headers={"Idempotency-Key": f"k{n}"},
                                    json={"mechanism": "rr", "epsilon": 0.01,
                                          "example_ids": [ids[i] for i in chosen]})
                    if r.status_code != 201:
                        errors.append(f"release {n}: {r.status_code} {r.text[:200]}")

            def audit() -> None:
                while not done.is_set():
                    started = time.monotonic()
                    try:
                        pinned = signing.read_heads(log) if log.exists() else []
                        report = verification.verify(ctx.sessions, ctx.ledger, pinned=pinned, public_key=public,
                                                     heads_log=lambda: signing.read_log(log.parent))
                    except Exception as err:  # noqa: BLE001 - a crash is what this measures
                        errors.append(f"verify-audit raised {type(err).__name__}: {err}")
                        continue
                    runs.append({"seconds": time.monotonic() - started, "valid": report["valid"],
                                 "pinned": len(pinned), "problems": [
                                     p for d in report["datasets"] for p in d["problems"]] +
                                 report.get("pinned", {}).get("problems", [])})

            started = time.monotonic()
            threads = [threading.Thread(target=charge, args=(w,)) for w in range(workers)]
            auditor = threading.Thread(target=audit)
            auditor.start()
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            charging = time.monotonic() - started
            done.set()
            auditor.join()
            final = verification.verify(ctx.sessions, ctx.ledger, pinned=signing.read_heads(log), public_key=public,
                                        heads_log=lambda: signing.read_log(log.parent))
        seconds = [r["seconds"] for r in runs]
        return {"releases": releases, "workers": workers, "database": database_url.split(":", 1)[0],
                "charging_seconds": round(charging, 2), "verify_runs": len(runs),
                "verify_runs_invalid": sum(not r["valid"] for r in runs),
                "verify_seconds_median": round(float(np.median(seconds)), 3) if seconds else None,
                "verify_seconds_max": round(max(seconds), 3) if seconds else None,
                "problems": sorted({p for r in runs for p in r["problems"]}), "errors": errors,
                "final_valid": final["valid"], "final_entries": final["datasets"][0]["entries"],
                "exported_heads": len(signing.read_heads(log))}
    finally:
        ctx.close()
