"""End-to-end over HTTP on loopback: upload N integer labels (a CSV file written before the clock starts, streamed
from disk), release them with the optimal unbiased randomizer, download them (streamed CSV). Prints seconds and
rates per phase and the peak memory (VmHWM) of the server and of this client; ``--json`` prints one JSON object.

Run: `.venv/bin/python bench/service_e2e.py [--n 100000000] [--json] [--database-url URL]`
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from labeldp.local_services import free_port, serve_process
from labels_party.http.auth import create_key
from labels_party.runtime.context import ServiceContext, make_context


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class MemoryWatch:
    """Samples a process's resident memory (anonymous and file-backed, from /proc) every 0.1 s, per phase."""

    def __init__(self, pid: int):
        self.pid, self.phase, self.peaks = pid, "start", {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _sample(self) -> dict:
        fields = {}
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            name, _, value = line.partition(":")
            if name in ("VmRSS", "RssAnon", "RssFile"):
                fields[name] = int(value.split()[0]) / 1024
        return fields

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            try:
                sample = self._sample()
            except (OSError, ValueError):
                return
            peak = self.peaks.setdefault(self.phase, {})
            for name, value in sample.items():
                peak[name] = max(peak.get(name, 0.0), value)

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join()
        return self.peaks


@contextlib.contextmanager
def labels_server(work: Path, url: str, env: dict[str, str] | None = None
                  ) -> Iterator[tuple[subprocess.Popen, httpx.Client, ServiceContext]]:
    """``labeldp labels serve`` over ``url`` and ``work/data`` on a free loopback port (its log in
    ``work/server.log``), an admin key made for it, a client with that key (long timeouts: benches upload 10⁷
    rows) and a context on the same storage (to read what the server stored)."""
    ctx = make_context(url, work / "data")
    with ctx.sessions() as session, session.begin():
        key = create_key(ctx.ledger, session, "bench", "admin")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "labeldp", "labels", "serve", "--port", str(port), "--database-url", url,
               "--data-dir", str(work / "data")]
    try:
        with serve_process(command, base, env={**os.environ, **(env or {})}, log=work / "server.log") as server, \
                httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=3600) as client:
            yield server, client, ctx
    finally:
        ctx.close()


def write_csv(path: Path, n: int, chunk: int = 1_000_000) -> None:
    """u0..u{n-1} with labels 1..52 (weeks), as pyarrow writes CSV (fast enough for 10⁸ rows)."""
    rng = np.random.default_rng(0)
    with pacsv.CSVWriter(path, pa.schema([("example_id", pa.string()), ("label", pa.int64())])) as writer:
        for start in range(0, n, chunk):
            stop = min(n, start + chunk)
            ids = pc.binary_join_element_wise("u", pc.cast(pa.array(np.arange(start, stop)), pa.string()), "")
            writer.write_table(pa.table({"example_id": ids, "label": rng.integers(1, 53, size=stop - start)}))


def file_body(path: Path, chunk: int = 1 << 20):
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            yield block


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=10_000_000)
    parser.add_argument("--database-url")
    parser.add_argument("--mesh", type=int, default=52)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="labeldp-bench-"))
    body = work / "labels.csv"
    write_csv(body, args.n)
    url = args.database_url or f"sqlite:///{work}/labels.db"
    with labels_server(work, url) as (server, client, _ctx):
        dataset = client.post("/v1/datasets", json={"name": "bench", "label_kind": "integer", "min": 1,
                                                    "max": 52, "epsilon_total": 10}).json()["id"]
        watch = MemoryWatch(server.pid)
        watch.phase = "upload"
        started = time.perf_counter()
        upload = client.put(f"/v1/datasets/{dataset}/labels", content=file_body(body),
                            headers={"Content-Type": "text/csv"})
        upload.raise_for_status()
        t_upload = time.perf_counter() - started
        watch.phase = "release"
        started = time.perf_counter()
        release = client.post(f"/v1/datasets/{dataset}/releases", headers={"Idempotency-Key": "bench"},
                              json={"mechanism": "opt-unbiased", "epsilon": 1.0, "mesh": args.mesh})
        release.raise_for_status()
        t_release = time.perf_counter() - started
        watch.phase = "download"
        started = time.perf_counter()
        rows, size = 0, 0
        with client.stream("GET", f"/v1/releases/{release.json()['id']}/labels") as response:
            response.raise_for_status()
            for chunk in response.iter_bytes():
                rows += chunk.count(b"\n")
                size += len(chunk)
        t_download = time.perf_counter() - started
        server_peak = peak_rss_mb(server.pid)  # while it runs
        phases = watch.stop()
    client_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result = {"labels": args.n, "database": url.split(":")[0], "mechanism": "opt-unbiased", "mesh": args.mesh,
              "epsilon": 1.0, "certified_epsilon": release.json()["certified_epsilon"],
              "body_mb": body.stat().st_size / 1e6, "downloaded_rows": rows - 1, "downloaded_mb": size / 1e6,
              "seconds": {"upload": t_upload, "release": t_release, "download": t_download},
              "labels_per_second": {"upload": args.n / t_upload, "release": args.n / t_release,
                                    "download": args.n / t_download},
              "peak_rss_mb": {"server": server_peak, "client": client_peak},
              "server_peak_by_phase_mb": phases, "cpus": os.cpu_count()}
    shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"labels: {args.n:,}  database: {result['database']}  mechanism: opt-unbiased (mesh {args.mesh}), eps=1")
    print(f"upload   {t_upload:8.1f} s   ({args.n / t_upload:,.0f} labels/s, {result['body_mb']:,.0f} MB CSV)")
    print(f"release  {t_release:8.1f} s   (prior + solve + sampling + write + charge; "
          f"certified eps {result['certified_epsilon']:.6f})")
    print(f"download {t_download:8.1f} s   ({rows - 1:,} rows, {size / 1e6:,.0f} MB CSV)")
    print(f"peak RSS: server {server_peak:,.0f} MB, client {client_peak:,.0f} MB")
    for phase, peak in phases.items():
        print(f"  server during {phase:8s}: " + ", ".join(f"{k} {v:,.0f} MB" for k, v in peak.items()))


if __name__ == "__main__":
    main()
