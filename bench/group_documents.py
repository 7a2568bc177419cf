"""A group release of many one-example groups (issue 28, item 1: 1000 groups of rr-with-prior on 256 classes took
the server from 559 MB to 4.1 GB and made a 303 MB document at 2000). Against a real server process on loopback:
its resident memory (VmRSS) before and after the release (a warm-up release first, so that imports and caches
count as before), the stored mechanism document's size (the packed bytes the database holds), and how long the
document takes to fetch as JSON and in its binary form; ``--json`` prints one JSON object.

Run: `.venv/bin/python bench/group_documents.py [--groups 1000] [--classes 256] [--json]`
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from service_e2e import labels_server

from labels_party.ledger.documents import BINARY_MEDIA_TYPE
from labels_party.store import db


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def groups_body(ids: list[str], groups: list[str]) -> bytes:
    sink = io.BytesIO()
    pq.write_table(pa.table({"example_id": ids, "group": groups}), sink)
    return sink.getvalue()


def group_release(client: httpx.Client, dataset: str, key: str, count: int, args) -> dict:
    ids = [f"e{i}" for i in range(count)]
    response = client.post(
        f"/v1/datasets/{dataset}/group-releases",
        params={"mechanism": "rr-with-prior", "epsilon": args.epsilon, "prior_epsilon": args.prior_epsilon},
        content=groups_body(ids, [f"group-{i}" for i in range(count)]),
        headers={"Content-Type": "application/vnd.apache.parquet", "Idempotency-Key": key})
    response.raise_for_status()
    return response.json()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--groups", type=int, default=1000)
    parser.add_argument("--classes", type=int, default=256)
    parser.add_argument("--epsilon", type=float, default=0.002)
    parser.add_argument("--prior-epsilon", type=float, default=0.001)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="labeldp-bench-"))
    url = f"sqlite:///{work}/labels.db"
    limits = {"LABELDP_MAX_GROUPS_PER_RELEASE": str(max(args.groups, 1000))}
    with labels_server(work, url, limits) as (server, client, ctx):
        dataset = client.post("/v1/datasets", json={"name": "bench", "label_kind": "classes",
                                                    "num_classes": args.classes,
                                                    "epsilon_total": 10.0}).json()["id"]
        labels = np.random.default_rng(0).integers(0, args.classes, size=args.groups)
        body = "example_id,label\n" + "".join(f"e{i},{v}\n" for i, v in enumerate(labels))
        client.put(f"/v1/datasets/{dataset}/labels", content=body,
                   headers={"Content-Type": "text/csv"}).raise_for_status()
        group_release(client, dataset, "warm-up", min(50, args.groups), args)
        before = rss_mb(server.pid)
        started = time.perf_counter()
        release = group_release(client, dataset, "bench", args.groups, args)
        seconds = time.perf_counter() - started
        after = rss_mb(server.pid)
        digest = release["mechanism_hash"]
        started = time.perf_counter()
        as_json = client.get(f"/v1/mechanisms/{digest}")
        as_json.raise_for_status()
        t_json = time.perf_counter() - started
        started = time.perf_counter()
        binary = client.get(f"/v1/mechanisms/{digest}", headers={"Accept": BINARY_MEDIA_TYPE})
        binary.raise_for_status()
        t_binary = time.perf_counter() - started
        after_fetch = rss_mb(server.pid)
        with ctx.sessions() as session:
            stored = len(session.get(db.MechanismDocument, digest).body)
    description = as_json.json()["description"]
    result = {"groups": args.groups, "classes": args.classes, "mechanism": "rr-with-prior", "epsilon": args.epsilon,
              "prior_epsilon": args.prior_epsilon, "certified_epsilon": release["certified_epsilon"],
              "distinct_randomizers": len(description["mechanisms"]), "release_seconds": seconds,
              "server_rss_mb": {"before": before, "after": after, "growth": after - before,
                                "after_fetches": after_fetch},
              "document_bytes": {"stored": stored, "binary_response": len(binary.content),
                                 "json_response": len(as_json.content)},
              "fetch_seconds": {"json": t_json, "binary": t_binary}}
    shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{args.groups} groups of rr-with-prior on {args.classes} classes, eps={args.epsilon} "
          f"(prior {args.prior_epsilon}): {seconds:.1f} s")
    print(f"server RSS  {before:8.1f} MB before, {after:8.1f} MB after (+{after - before:.1f} MB), "
          f"{after_fetch:.1f} MB after both fetches")
    print(f"document    {stored / 1e6:8.3f} MB stored, {len(as_json.content) / 1e6:.3f} MB as JSON "
          f"({t_json:.2f} s), {len(binary.content) / 1e6:.3f} MB binary ({t_binary:.2f} s); "
          f"{result['distinct_randomizers']} distinct randomizers")


if __name__ == "__main__":
    main()
