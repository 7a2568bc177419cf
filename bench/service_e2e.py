"""End-to-end over HTTP on loopback: upload N integer labels (streamed CSV), release them with the optimal unbiased
randomizer, download them (streamed CSV). Prints seconds per phase and peak memory of server and client.

Run: `.venv/bin/python bench/service_e2e.py [--n 10000000] [--database-url URL]`
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from labels_party.auth import create_key
from labels_party.service import make_context


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def csv_body(n: int, chunk: int = 1_000_000):
    rng = np.random.default_rng(0)
    yield b"example_id,label\n"
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        labels = rng.integers(1, 53, size=stop - start)
        yield "".join(f"u{i},{v}\n" for i, v in zip(range(start, stop), labels, strict=True)).encode()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=10_000_000)
    parser.add_argument("--database-url")
    parser.add_argument("--mesh", type=int, default=52)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="labeldp-bench-"))
    url = args.database_url or f"sqlite:///{work}/labels.db"
    ctx = make_context(url, work / "data")
    with ctx.sessions() as session, session.begin():
        key = create_key(session, "bench", "admin")
    port = 18000 + os.getpid() % 1000
    server = subprocess.Popen([sys.executable, "-m", "labeldp", "labels", "serve", "--port", str(port),
                               "--database-url", url, "--data-dir", str(work / "data")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    headers = {"Authorization": f"Bearer {key}"}
    try:
        for _ in range(300):
            try:
                httpx.get(f"{base}/healthz", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.1)
        with httpx.Client(base_url=base, headers=headers, timeout=3600) as client:
            dataset = client.post("/v1/datasets", json={"name": "bench", "label_kind": "integer", "min": 1,
                                                        "max": 52, "epsilon_total": 10}).json()["id"]
            started = time.perf_counter()
            upload = client.put(f"/v1/datasets/{dataset}/labels", content=csv_body(args.n),
                                headers={"Content-Type": "text/csv"})
            upload.raise_for_status()
            t_upload = time.perf_counter() - started
            started = time.perf_counter()
            release = client.post(f"/v1/datasets/{dataset}/releases", headers={"Idempotency-Key": "bench"},
                                  json={"mechanism": "opt-unbiased", "epsilon": 1.0, "mesh": args.mesh})
            release.raise_for_status()
            t_release = time.perf_counter() - started
            started = time.perf_counter()
            rows, size = 0, 0
            with client.stream("GET", f"/v1/releases/{release.json()['id']}/labels") as response:
                response.raise_for_status()
                for chunk in response.iter_bytes():
                    rows += chunk.count(b"\n")
                    size += len(chunk)
            t_download = time.perf_counter() - started
        server_peak = peak_rss_mb(server.pid)
    finally:
        server.terminate()
        server.wait()
    client_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"labels: {args.n:,}  database: {url.split(':')[0]}  mechanism: opt-unbiased (mesh {args.mesh}), eps=1")
    print(f"upload   {t_upload:8.1f} s   ({args.n / t_upload:,.0f} labels/s)")
    print(f"release  {t_release:8.1f} s   (prior + LP + sampling + write + charge; "
          f"certified eps {release.json()['certified_epsilon']:.6f})")
    print(f"download {t_download:8.1f} s   ({rows - 1:,} rows, {size / 1e6:,.0f} MB CSV)")
    print(f"peak RSS: server {server_peak:,.0f} MB, client {client_peak:,.0f} MB")


if __name__ == "__main__":
    main()
