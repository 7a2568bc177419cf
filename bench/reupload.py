"""A re-upload at scale over HTTP on loopback (issue 28, item 5): N labels with 64-character ids, then N more of
which half are known (ids N/2 .. 3N/2) on top of them. The second upload joins against a registry of N ids: it
must run in bounded memory (DuckDB spills under the data directory). Prints each upload's seconds and the server's
peak resident memory per phase; ``--json`` prints one JSON object.

Run: `.venv/bin/python bench/reupload.py [--n 10000000] [--memory-mb 128] [--json]`
"""

from __future__ import annotations

import argparse
import binascii
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
from service_e2e import MemoryWatch, file_body, labels_server, peak_rss_mb


def _mixed(values: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer: distinct inputs, distinct well-spread outputs."""
    z = values + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def hex_ids(start: int, stop: int) -> pa.Array:
    """Ids start..stop-1 as 64 hexadecimal characters each, like SHA-256 digests (what broke the join)."""
    k = np.arange(start, stop, dtype=np.uint64)
    with np.errstate(over="ignore"):
        words = np.stack([_mixed(k * np.uint64(4) + np.uint64(j)) for j in range(4)], axis=1)
    hexed = binascii.hexlify(words.astype(">u8").tobytes())
    fixed = pa.FixedSizeBinaryArray.from_buffers(pa.binary(64), stop - start, [None, pa.py_buffer(hexed)])
    return fixed.cast(pa.binary()).cast(pa.string())


def write_csv(path: Path, start: int, stop: int, chunk: int = 1_000_000) -> None:
    with pacsv.CSVWriter(path, pa.schema([("example_id", pa.string()), ("label", pa.int64())])) as writer:
        for low in range(start, stop, chunk):
            high = min(stop, low + chunk)
            writer.write_table(pa.table({"example_id": hex_ids(low, high),
                                         "label": np.arange(low, high) % 52 + 1}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=10_000_000)
    parser.add_argument("--memory-mb", type=int, default=128, help="the server's LABELDP_UPLOAD_MEMORY_MB")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    n = args.n
    work = Path(tempfile.mkdtemp(prefix="labeldp-reupload-"))
    first_body, second_body = work / "first.csv", work / "second.csv"
    write_csv(first_body, 0, n)
    write_csv(second_body, n // 2, n + n // 2)
    url = f"sqlite:///{work}/labels.db"
    with labels_server(work, url, {"LABELDP_UPLOAD_MEMORY_MB": str(args.memory_mb)}) as (server, client, _ctx):
        dataset = client.post("/v1/datasets", json={"name": "bench", "label_kind": "integer", "min": 1,
                                                    "max": 52, "epsilon_total": 10}).json()["id"]
        watch = MemoryWatch(server.pid)
        time.sleep(0.5)  # phase "start": the idle server
        results, seconds = [], {}
        for phase, body in (("first", first_body), ("second", second_body)):
            watch.phase = phase
            started = time.perf_counter()
            response = client.put(f"/v1/datasets/{dataset}/labels", content=file_body(body),
                                  headers={"Content-Type": "text/csv"})
            seconds[phase] = time.perf_counter() - started
            response.raise_for_status()
            results.append(response.json())
        watch.phase = "after"
        time.sleep(0.3)
        server_peak = peak_rss_mb(server.pid)  # while it runs
        phases = watch.stop()
    shutil.rmtree(work, ignore_errors=True)
    result = {"labels": n, "id_characters": 64, "upload_memory_mb": args.memory_mb,
              "first": results[0], "second": results[1], "seconds": seconds,
              "peak_rss_mb": {"server": server_peak,
                              "by_phase": {phase: peak.get("VmRSS") for phase, peak in phases.items()}},
              "cpus": os.cpu_count()}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{n:,} labels (64-character ids), then {n:,} more of which {n // 2:,} known; DuckDB {args.memory_mb} MB")
    for phase in ("first", "second"):
        print(f"{phase:6s} upload {seconds[phase]:8.1f} s  new examples {result[phase]['new_examples']:,}  "
              f"server peak RSS {result['peak_rss_mb']['by_phase'].get(phase, float('nan')):,.0f} MB")
    print(f"server peak RSS overall: {server_peak:,.0f} MB")


if __name__ == "__main__":
    main()
