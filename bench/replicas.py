"""Release throughput of the labels service as 1 and as 2 replicas on one PostgreSQL database and one data
directory: the same client (``--concurrency`` threads, each request to the replicas in turn), the same machine.

Each run gets a fresh database (created from ``--database-url``'s server) and data directory, ``--orgs``
organizations with one dataset of ``--n`` integer labels each, and sends ``--releases`` whole-dataset releases
(``rr`` at ε = 0.01, distinct Idempotency-Keys) spread over the organizations. The release quotas are raised for
the bench (they would otherwise cap one organization at 2 releases at once per process, and the comparison would
measure them, not the replicas). Prints releases per second per run and the ratio; ``--json`` one JSON object.

Run: `PYTHONPATH=. .venv/bin/python bench/replicas.py --database-url postgresql://…/postgres [--releases 200]
[--json]` (a PostgreSQL server, e.g. from `.ci/postgres.sh`; SQLite has one writer and is refused).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from labeldp.local_services import free_port, serve_process  # noqa: E402
from labels_party.http.auth import create_key  # noqa: E402
from labels_party.runtime.context import make_context  # noqa: E402
from shared.service.sealing import write_key_file  # noqa: E402
from tests.support.databases import fresh_database  # noqa: E402

EPSILON = 0.01


@contextlib.contextmanager
def replicas(url: str, work: Path, count: int) -> Iterator[list[str]]:
    """``count`` ``labeldp labels serve`` processes on ``url`` and ``work/data``; their base URLs."""
    write_key_file(work / "secret.key")
    env = {**os.environ, "LABELDP_SECRET_KEY_FILE": str(work / "secret.key"), "LABELDP_RELEASE_SLOTS_PER_ORG": "16",
           "LABELDP_RELEASE_SLOTS": "16", "LABELDP_RELEASE_QUEUE_SECONDS": "60"}
    with contextlib.ExitStack() as stack:
        bases = []
        for index in range(count):
            port = free_port()
            base = f"http://127.0.0.1:{port}"
            stack.enter_context(serve_process(
                [sys.executable, "-m", "labeldp", "labels", "serve", "--port", str(port), "--database-url", url,
                 "--data-dir", str(work / "data")], base, env=env, log=work / f"replica-{index}.log"))
            bases.append(base)
        yield bases


def run(server_url: str, replica_count: int, releases: int, concurrency: int, orgs: int, n: int) -> dict:
    server = server_url.replace("postgresql://", "postgresql+psycopg://", 1)  # the driver installed here
    with tempfile.TemporaryDirectory(prefix="labeldp-replicas-") as root, \
            fresh_database("postgresql", root, server) as url:
        work = Path(root)
        ctx = make_context(url, work / "data", upgrade=True)
        with ctx.sessions() as session, session.begin():
            keys = [create_key(ctx.ledger, session, f"org{i}", "admin") for i in range(orgs)]
        ctx.close()
        with replicas(url, work, replica_count) as bases:
            clients = [[httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=300)
                        for base in bases] for key in keys]
            rng = np.random.default_rng(0)
            datasets = []
            for org, per_replica in enumerate(clients):
                body = "example_id,label\n" + "".join(f"e{i},{v}\n" for i, v in enumerate(rng.integers(1, 53, n)))
                dataset = per_replica[0].post("/v1/datasets", json={
                    "name": f"bench{org}", "label_kind": "integer", "min": 1, "max": 52,
                    "epsilon_total": EPSILON * releases}).raise_for_status().json()["id"]
                per_replica[0].put(f"/v1/datasets/{dataset}/labels", content=body,
                                   headers={"Content-Type": "text/csv"}).raise_for_status()
                datasets.append(dataset)

            def release(i: int) -> tuple[int, float]:
                org = i % orgs
                client = clients[org][i % replica_count]
                started = time.perf_counter()
                answer = client.post(f"/v1/datasets/{datasets[org]}/releases",
                                     headers={"Idempotency-Key": f"bench-{i}"},
                                     json={"mechanism": "rr", "epsilon": EPSILON})
                return answer.status_code, time.perf_counter() - started

            started = time.perf_counter()
            with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
                outcomes = list(pool.map(release, range(releases)))
            seconds = time.perf_counter() - started
            for per_replica in clients:
                for client in per_replica:
                    client.close()
    statuses: dict[str, int] = {}
    for status, _ in outcomes:
        statuses[str(status)] = statuses.get(str(status), 0) + 1
    latencies = sorted(latency for _, latency in outcomes)
    return {"replicas": replica_count, "releases": releases, "seconds": round(seconds, 2),
            "releases_per_second": round(releases / seconds, 2), "statuses": statuses,
            "median_latency_s": round(statistics.median(latencies), 3),
            "p95_latency_s": round(latencies[int(0.95 * (len(latencies) - 1))], 3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", required=True, help="a PostgreSQL server URL (a database is created)")
    parser.add_argument("--releases", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--orgs", type=int, default=4)
    parser.add_argument("--n", type=int, default=10_000, help="labels per dataset")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not args.database_url.startswith("postgresql"):
        print("bench/replicas.py: needs a PostgreSQL server (--database-url postgresql://…)", file=sys.stderr)
        return 2
    runs = [run(args.database_url, count, args.releases, args.concurrency, args.orgs, args.n) for count in (1, 2)]
    result = {"runs": runs, "ratio_2_to_1": round(runs[1]["releases_per_second"] / runs[0]["releases_per_second"], 2),
              "cpu_count": os.cpu_count(), "concurrency": args.concurrency, "labels_per_dataset": args.n}
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0 if all(r["statuses"] == {"201": args.releases} for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
