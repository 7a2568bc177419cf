"""Issue 29: the labels party as two replicas for real — two ``labeldp labels serve`` processes on one PostgreSQL
database and one data directory, with one secret key file (and one audit key, whose signed heads both export).

* 64 concurrent releases of one dataset, alternating between the replicas, on a budget that admits exactly 5:
  exactly 5 are charged and the rest refused ``budget_exceeded``; the dataset's spent ε is their exact sum (the
  datasets' row locks serialize charges from both processes; anchors and signed heads keep up);
* a source dataset registered through one replica is copied and counted by whichever claims its job; its release's
  Spark job is killed mid-run with its process (``kill -9`` of the replica whose worker holds the job's lease, read
  from ``lease_owner``): the other replica takes it over once the lease (5 s) expires and makes the release
  available without the client sending anything again; one ledger record; ``verify-audit`` (with the signed heads
  log) is clean; the killed replica starts again beside the live one and collects nothing of its;
* an uploaded dataset's release, computed in its request, whose replica is killed (``kill -9``) mid-way: the other
  replica's worker fails it once its lease (5 s) expired — no process starts alone — charged once, no file; the
  client's re-send with its Idempotency-Key answers ``release_failed`` (no longer ``release_in_progress``).

Needs PostgreSQL (LABELDP_TEST_POSTGRES_URL) and Java. The measured times are printed. ~2 min on 2 cores.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

import httpx
import numpy as np
import pytest
from sqlalchemy import create_engine, text

from labeldp.local_services import free_port, serve_process
from tests.labels_party.spark.sources import write_source
from tests.support.databases import POSTGRES_URL, fresh_database

pytestmark = pytest.mark.slow

LEASE_SECONDS = 5
# How long a wait may take before the test fails: a bound for a failure, not a speed (issue 40: the lease's expiry
# "then the next poll" took longer than any stopwatch allowed on a loaded machine); what a takeover must show is a
# lower bound — claimed after the dead process's lease expired — and the attempt count.
FAILURE_BOUND = 600
RELEASES, ADMITTED = 64, 5
SOURCE_ROWS = 400_000
UPLOADED_ROWS = 5_000_000  # a release computed in its request for seconds: killed while it computes


def _cli(env: dict, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "labeldp", "labels", *args], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _lease_expiry(engine, kind: str, subject_id: str) -> datetime:
    with engine.connect() as connection:
        expires = connection.execute(text("SELECT lease_expires_at FROM jobs WHERE kind = :k AND subject_id = :s"),
                                     {"k": kind, "s": subject_id}).scalar()
    return _aware(expires)


def _aware(moment: datetime) -> datetime:
    """A timestamp read with plain SQL, in UTC (PostgreSQL's timestamptz comes back aware already)."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)


def _until(what: str, check, seconds: float, every: float = 0.1):
    deadline = time.monotonic() + seconds
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {seconds:g} s")
        time.sleep(every)


def _a_release_killed_in_its_request(http, engine, data: Path, process, victim: str, survivor: str, owner: dict,
                                     publisher: dict, heads_log: Path) -> float:
    """A release of an uploaded dataset sent to ``victim``, whose process is killed while the request computes it:
    the survivor's worker fails it once its lease expired (no process starts alone); the client's re-send with its
    key answers ``release_failed``, charged once, no file. Returns the seconds from the kill to the failure."""
    dataset = http.post(f"{survivor}/v1/datasets", headers=owner, json={
        "name": "uploaded", "label_kind": "integer", "min": 0, "max": 9, "epsilon_total": 3}).json()["id"]
    rows = "".join(f"u{i},{i % 10}\n" for i in range(UPLOADED_ROWS))
    assert http.put(f"{survivor}/v1/datasets/{dataset}/labels", content="example_id,label\n" + rows,
                    headers={**owner, "Content-Type": "text/csv"}).status_code == 200
    assert http.post(f"{survivor}/v1/datasets/{dataset}/grants", headers=owner,
                     json={"org": "publisher", "epsilon": 3}).status_code == 201
    body, headers = {"mechanism": "opt-unbiased", "epsilon": 1}, {**publisher, "Idempotency-Key": "uploaded"}

    def computing():
        """The release charged and computing, once its charge's signed head is exported: a kill between the commit
        and the export would leave entries no exported head covers, which verify-audit rightly reports (it cannot
        tell them from entries written outside the service)."""
        with engine.connect() as connection:
            found = connection.execute(text(
                "SELECT r.id, j.lease_owner FROM releases r JOIN jobs j ON j.subject_id = r.id "
                "AND j.kind = 'compute_release' WHERE r.dataset_id = :d AND r.state = 'running' "
                "AND j.state = 'running'"), {"d": dataset}).first()
            newest = connection.execute(text("SELECT max(seq) FROM ledger WHERE dataset_id = :d"),
                                        {"d": dataset}).scalar()
        heads = [json.loads(line) for line in heads_log.read_text().splitlines() if line.strip()]
        exported = any(head["dataset_id"] == dataset and head["seq"] >= newest for head in heads)
        return found if exported else None

    def outcome():
        with engine.connect() as connection:
            found = connection.execute(text(
                "SELECT r.state, r.error_json, j.state AS job, j.attempts, j.lease_owner, j.heartbeat_at "
                "FROM releases r JOIN jobs j ON j.subject_id = r.id AND j.kind = 'compute_release' WHERE r.id = :r"),
                {"r": release_id}).first()
        return found if found.state != "running" else None

    with ThreadPoolExecutor(1) as pool:
        sent = pool.submit(http.post, f"{victim}/v1/datasets/{dataset}/releases", json=body, headers=headers)
        release_id, lease_owner = _until("the release computing", computing, FAILURE_BOUND, 0.02)
        assert int(lease_owner.split(":")[1]) == process.pid
        os.kill(process.pid, signal.SIGKILL)  # mid-request: no failure recorded, no renewal
        killed = time.monotonic()
        expires = _lease_expiry(engine, "compute_release", release_id)  # final: its process renews nothing now
        with pytest.raises(httpx.TransportError):
            sent.result()
    done = _until("the release failed by the survivor", outcome, FAILURE_BOUND)
    failed_after = time.monotonic() - killed
    assert (done.state, json.loads(done.error_json)["code"], done.job, done.attempts, done.lease_owner) == \
        ("failed", "release_failed", "failed", 2, None)
    # claimed by the survivor once the lease had expired, not before (a lower bound: the claim's own time, which
    # a loaded machine can only make later)
    assert _aware(done.heartbeat_at) >= expires, (done.heartbeat_at, expires)
    resent = http.post(f"{survivor}/v1/datasets/{dataset}/releases", json=body, headers=headers)
    assert (resent.status_code, resent.json()["error"]["code"]) == (503, "release_failed"), resent.text
    with engine.connect() as connection:
        records = connection.execute(text("SELECT count(*) FROM ledger WHERE release_id = :r"),
                                     {"r": release_id}).scalar()
    assert records == 1
    assert not (data / "releases" / f"{release_id}.parquet").exists()
    return failed_after


def test_two_replicas_share_budgets_and_take_over_a_killed_spark_job(tmp_path):
    if not POSTGRES_URL:
        pytest.skip("set LABELDP_TEST_POSTGRES_URL: replicas share a PostgreSQL database")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark needs a Java runtime")
    sources = tmp_path / "sources"
    labels = np.random.default_rng(5).integers(0, 10, size=SOURCE_ROWS)
    write_source(sources / "weeks", [f"p{i:07d}" for i in range(SOURCE_ROWS)], labels.astype(np.int64), files=8)
    with fresh_database("postgresql", tmp_path) as url:
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
               "LABELDP_DATABASE_URL": url, "LABELDP_DATA_DIR": str(tmp_path / "data"),
               "LABELDP_SECRET_KEY_FILE": str(tmp_path / "secret.key"),
               "LABELDP_AUDIT_KEY_FILE": str(tmp_path / "audit.pem"), "LABELDP_AUDIT_LOG_DIR": str(tmp_path / "heads"),
               "LABELDP_JOB_LEASE_SECONDS": str(LEASE_SECONDS), "LABELDP_JOB_POLL_SECONDS": "0.5",
               "LABELDP_SPARK_SOURCES": json.dumps({"hospital": [f"{sources}/"]}), "LABELDP_SPARK_MASTER": "local[2]",
               # every request computed at once (the quotas are per process): the budget is what refuses
               "LABELDP_RELEASE_SLOTS": "64", "LABELDP_RELEASE_SLOTS_PER_ORG": "64",
               "LABELDP_RELEASE_QUEUE_SECONDS": "120"}
        (tmp_path / "heads").mkdir()
        _cli(env, "secret-key", "--key-file", str(tmp_path / "secret.key"))
        _cli(env, "audit-key", "--key-file", str(tmp_path / "audit.pem"))
        admin = _cli(env, "create-key", "--org", "hospital", "--role", "admin").strip()  # also builds the schema
        consumer = _cli(env, "create-key", "--org", "publisher", "--role", "consumer").strip()
        ports = [free_port(), free_port()]
        bases = [f"http://127.0.0.1:{port}" for port in ports]

        def serve(index: int, log: str):
            return serve_process([sys.executable, "-m", "labeldp", "labels", "serve", "--port", str(ports[index])],
                                 bases[index], env=env, log=tmp_path / log, seconds=600)

        engine = create_engine(url)
        with serve(0, "a.log") as first, serve(1, "b.log") as second, httpx.Client(timeout=300) as http:
            processes = {first.pid: 0, second.pid: 1}
            owner = {"Authorization": f"Bearer {admin}"}
            publisher = {"Authorization": f"Bearer {consumer}"}

            # -- one budget, two writers ---------------------------------------------------------------------------
            dataset = http.post(f"{bases[0]}/v1/datasets", headers=owner, json={
                "name": "small", "label_kind": "classes", "num_classes": 3, "epsilon_total": ADMITTED}).json()["id"]
            rows = "".join(f"e{i},{i % 3}\n" for i in range(500))
            assert http.put(f"{bases[1]}/v1/datasets/{dataset}/labels", content="example_id,label\n" + rows,
                            headers={**owner, "Content-Type": "text/csv"}).status_code == 200
            assert http.post(f"{bases[0]}/v1/datasets/{dataset}/grants", headers=owner,
                             json={"org": "publisher", "epsilon": ADMITTED}).status_code == 201

            def release(index: int) -> tuple[int, str]:
                answer = http.post(f"{bases[index % 2]}/v1/datasets/{dataset}/releases",
                                   headers={**publisher, "Idempotency-Key": f"r{index}"},
                                   json={"mechanism": "rr", "epsilon": 1})
                return answer.status_code, (answer.json().get("error") or {}).get("code", "")

            started = time.monotonic()
            with ThreadPoolExecutor(RELEASES) as pool:
                outcomes = Counter(pool.map(release, range(RELEASES)))
            print(f"\n{RELEASES} concurrent releases on two replicas: {dict(outcomes)} in "
                  f"{time.monotonic() - started:.1f} s")
            assert outcomes == {(201, ""): ADMITTED, (409, "budget_exceeded"): RELEASES - ADMITTED}
            spent = http.get(f"{bases[1]}/v1/datasets/{dataset}/budget", headers=owner).json()
            assert spent["epsilon_spent"] == ADMITTED and spent["epsilon_remaining"] == 0
            audit = http.get(f"{bases[0]}/v1/audit", params={"dataset": dataset}, headers=owner).json()
            assert len(audit["events"]) == ADMITTED and audit["chain_valid"]
            assert sum(e["record"]["charge_units"] for e in audit["events"]) == ADMITTED * 10**9  # exactly

            # -- a source registered through one replica, its release's job killed with the replica running it -----
            registered = http.post(f"{bases[1]}/v1/datasets", headers=owner, json={
                "name": "weeks", "label_kind": "integer", "min": 0, "max": 9, "epsilon_total": 3,
                "source": f"{sources}/weeks"})
            assert registered.status_code == 202, registered.text
            source = registered.json()["id"]
            ready = _until("the registration", lambda: (lambda d: d if d["state"] != "registering" else None)(
                http.get(f"{bases[0]}{registered.headers['location']}", headers=owner).json()), FAILURE_BOUND, 0.5)
            assert ready["state"] == "ready" and ready["num_examples"] == SOURCE_ROWS, ready
            assert http.post(f"{bases[0]}/v1/datasets/{source}/grants", headers=owner,
                             json={"org": "publisher", "epsilon": 3}).status_code == 201
            asked = http.post(f"{bases[0]}/v1/datasets/{source}/releases", json={"mechanism": "rr", "epsilon": 1},
                              headers={**publisher, "Idempotency-Key": "weekly"})
            assert asked.status_code == 202, asked.text
            release_id = asked.json()["id"]

            def lease():
                with engine.connect() as connection:
                    return connection.execute(text(
                        "SELECT lease_owner, attempts, heartbeat_at FROM jobs WHERE kind = 'privatize_source' "
                        "AND subject_id = :r "
                        "AND state = 'running'"), {"r": release_id}).first()

            holder = _until("the job's first lease", lease, FAILURE_BOUND)
            pid = int(holder.lease_owner.split(":")[1])
            assert pid in processes and holder.attempts == 1, holder
            attempts = tmp_path / "data" / "tmp" / "jobs"
            _until("the Spark job writing", lambda: list(attempts.glob(f"{release_id}.*/*")), FAILURE_BOUND, 0.05)
            assert http.get(f"{bases[processes[pid]]}/v1/releases/{release_id}",
                            headers=publisher).json()["state"] == "running"
            os.kill(pid, signal.SIGKILL)  # mid-job: no heartbeat, no cleanup
            killed = time.monotonic()
            expires = _lease_expiry(engine, "privatize_source", release_id)  # final: nothing renews it now
            survivor = bases[1 - processes[pid]]
            taken = _until("the takeover", lambda: (lambda h: h if h and h.attempts == 2 else None)(lease()),
                           FAILURE_BOUND)
            claimed = time.monotonic()
            assert int(taken.lease_owner.split(":")[1]) != pid
            done = _until("the release", lambda: (lambda r: r if r["state"] != "running" else None)(
                http.get(f"{survivor}/v1/releases/{release_id}", headers=publisher).json()), FAILURE_BOUND, 0.2)
            available = time.monotonic()
            print(f"replica {processes[pid]} (pid {pid}) killed mid-job: its lease taken over after "
                  f"{claimed - killed:.1f} s (lease {LEASE_SECONDS} s), the release available "
                  f"{available - killed:.1f} s after the kill")
            assert done["state"] == "available", done
            assert _aware(taken.heartbeat_at) >= expires  # taken over once the lease had expired, not before
            assert list(attempts.glob(f"{release_id}.*")) != []  # the dead attempt's files: left for a lone start
            table = http.get(f"{survivor}/v1/releases/{release_id}/labels", headers=publisher)
            assert table.status_code == 200 and table.text.count("\n") == SOURCE_ROWS + 1
            with engine.connect() as connection:
                records = [json.loads(r) for r in connection.execute(text(
                    "SELECT record FROM ledger WHERE release_id = :r ORDER BY seq"), {"r": release_id}).scalars()]
                job = connection.execute(text("SELECT state, attempts, sealed_secret FROM jobs WHERE subject_id = :r"),
                                         {"r": release_id}).first()
            # charged once (by the first attempt), its document stated when queued, made available once (by the
            # attempt that finished)
            assert [r["event"] for r in records] == ["label_release", "release_document", "release_available"], \
                records
            assert tuple(job) == ("succeeded", 2, None)

            # the killed replica starts again beside the live one: it collects nothing, answers the same
            with serve(processes[pid], "restarted.log") as restarted:
                assert list(attempts.glob(f"{release_id}.*")) != []  # another process is live: nothing collected
                again = http.get(f"{bases[processes[pid]]}/v1/releases/{release_id}/labels", headers=publisher)
                assert again.status_code == 200 and again.text == table.text

                # -- a release computed in its request, its replica killed mid-way -------------------------------
                failed_after = _a_release_killed_in_its_request(http, engine, tmp_path / "data", restarted,
                                                                bases[processes[pid]], survivor, owner, publisher,
                                                                tmp_path / "heads" / "heads.jsonl")
                print(f"replica {processes[pid]} killed while computing a release in its request: the release "
                      f"failed by the other {failed_after:.1f} s after the kill (lease {LEASE_SECONDS} s)")
        engine.dispose()
        report = json.loads(_cli(env, "verify-audit"))
        assert report["valid"], report
