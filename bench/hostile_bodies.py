"""Hostile request bodies against live services (issue 40): for every route that takes a body, the worst body this
bench can construct within the services' limits — Parquet decompression bombs, huge JSON arrays, deep nesting, wide
class domains, lone surrogates — each sent to a **fresh** server process (``labeldp labels serve`` / ``labeldp
features serve`` on SQLite in a temporary directory), after a small request of the same route loaded its code.
Per body: the answer (status, code), the seconds it took, the server's peak RSS growth (VmHWM, reset through
``/proc/PID/clear_refs`` just before the body, minus VmRSS then) and its CPU seconds (utime + stime of all its
threads); whether the process survived. Then four of the largest JSON bodies at once on one server, and four honest
group bodies at the default bound (512 MiB counted each) at once.

Checks (issue 40): peak RSS growth ≤ 256 MB for each body, ≤ 1 GB for four JSON bodies at once and ≤ 1.3 times the
columnar budget (1 GiB) for the four group bodies, CPU ≤ 2 s for a body ≤ 1 MB, and the server alive after each.

Run: `.venv/bin/python bench/hostile_bodies.py [--json] [--only NAME,...] [--root PATH]`. ``--root`` runs the
services of another checkout (e.g. ``git worktree add /tmp/before <commit>``) with this bench's bodies.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.support.parquet_craft import (  # noqa: E402
    Column,
    data_page,
    parquet_file,
    plain_doubles,
    plain_strings,
    varint,
)
from tests.support.parquet_lies import understated  # noqa: E402

HERE = Path(__file__).resolve().parent.parent
MB = 1 << 20
JSON_BYTES = 60 * MB  # under both services' 64 MiB JSON limit (max_json_bytes)
RSS_LIMIT_MB = 256
FOUR_LIMIT_MB = 1024
CPU_LIMIT_S = 2.0
SMALL_BODY = 1_000_000  # bytes: the CPU check applies to bodies of at most this size
N = 1000  # examples per dataset
# The "large" dataset, for honest group bodies at the default bound (max_columnar_decoded_bytes, 512 MiB): a row of
# an 8-character id counts 136 + 64 + 6 × 8 = 248 bytes, so 2.1·10⁶ rows count 497 MiB
LARGE_N, AT_BOUND_ROWS = 2_200_000, 2_100_000
COLUMNAR_BUDGET_MB = 1024  # columnar_decode_budget_bytes' default


# -- processes ------------------------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def status_field(pid: int, name: str) -> int:
    """A /proc/PID/status field in kB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1])
    raise KeyError(name)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (all threads)


@dataclass
class Server:
    process: subprocess.Popen
    port: int

    @property
    def pid(self) -> int:
        return self.process.pid


class Deployment:
    """The services of one checkout (``root``) on SQLite under ``work``: keys, datasets, and fresh servers."""

    def __init__(self, root: Path, work: Path):
        self.root, self.work = root, work
        self.env = {**os.environ, "PYTHONPATH": str(root), "LABELDP_RELEASE_QUEUE_SECONDS": "60"}
        self.labels_url = f"sqlite:///{work}/labels.db"
        self.trainer_url = f"sqlite:///{work}/trainer.db"
        self.labels_port = free_port()  # one port for every labels server: the trainer is configured with it

    def cli(self, *args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "labeldp", *args], cwd=self.root, env=self.env,
                              capture_output=True, text=True, timeout=600)
        if done.returncode:
            raise RuntimeError(f"labeldp {' '.join(args)}: {done.stdout}{done.stderr}")
        return done.stdout.strip()

    @contextlib.contextmanager
    def serve(self, party: str, log: str, env: dict | None = None) -> Iterator[Server]:
        if party == "labels":
            port = self.labels_port
            command = ["labels", "serve", "--database-url", self.labels_url, "--data-dir", str(self.work / "data")]
        else:
            port = free_port()
            command = ["features", "serve", "--database-url", self.trainer_url, "--data-dir",
                       str(self.work / "trainer"), "--labels-party", f"office=http://127.0.0.1:{self.labels_port}"]
        with open(self.work / log, "w") as output:
            process = subprocess.Popen([sys.executable, "-m", "labeldp", *command, "--port", str(port)],
                                       cwd=self.root, env={**self.env, **(env or {})}, stdout=output,
                                       stderr=subprocess.STDOUT)
            try:
                deadline = time.monotonic() + 300
                while True:
                    if process.poll() is not None:
                        raise RuntimeError(f"{party} server exited: see {self.work / log}")
                    with contextlib.suppress(OSError):
                        if request(port, "GET", "/healthz", timeout=5).status == 200:
                            break
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{party} server did not start: see {self.work / log}")
                    time.sleep(0.2)
                yield Server(process, port)
            finally:
                process.terminate()
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


# -- HTTP: a raw client, so that an answer sent before the body is all read is still read ----------------------------

@dataclass
class Answer:
    status: int | None
    body: bytes = b""
    seconds: float = 0.0
    error: str | None = None

    def json(self):
        try:
            return json.loads(self.body)
        except ValueError:
            return None

    @property
    def code(self) -> str | None:
        document = self.json()
        error = document.get("error") if isinstance(document, dict) else None
        return error.get("code") if isinstance(error, dict) else None


def request(port: int, method: str, path: str, body: bytes = b"", headers: dict | None = None,
            timeout: float = 600) -> Answer:
    """One HTTP/1.1 request (Connection: close); the body is sent from another thread while the answer is read."""
    head = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", "Connection: close", f"Content-Length: {len(body)}"]
    head += [f"{name}: {value}" for name, value in (headers or {}).items()]
    started = time.perf_counter()
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        def send() -> None:
            with contextlib.suppress(OSError):
                sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
                view = memoryview(body)
                for start in range(0, len(body), MB):
                    sock.sendall(view[start:start + MB])

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        received = bytearray()
        try:
            while chunk := sock.recv(1 << 16):
                received += chunk
        except OSError as err:
            if not received:
                return Answer(None, seconds=time.perf_counter() - started, error=f"{type(err).__name__}: {err}")
        seconds = time.perf_counter() - started
    finally:
        sock.close()
    if not received:
        return Answer(None, seconds=seconds, error="connection closed without an answer")
    header, _, content = bytes(received).partition(b"\r\n\r\n")
    status = int(header.split(b" ", 2)[1])
    if b"transfer-encoding: chunked" in header.lower():
        content = _unchunk(content)
    return Answer(status, content, seconds)


def _unchunk(data: bytes) -> bytes:
    out, rest = bytearray(), data
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line.split(b";")[0] or b"0", 16)
        if size == 0:
            break
        out += rest[:size]
        rest = rest[size + 2:]
    return bytes(out)


def json_body(value) -> bytes:
    return json.dumps(value).encode()


def parquet_bytes(table: pa.Table, **options) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd", **options)
    return sink.getvalue()


def dictionary_column(count: int, values: list) -> pa.DictionaryArray:
    return pa.DictionaryArray.from_arrays(pa.array(np.zeros(count, np.int32)), pa.array(values))


# -- the bodies -----------------------------------------------------------------------------------------------------

@dataclass
class Case:
    """A body for one route: ``make`` builds (method, path, body, headers) from the deployment's state; ``warm``
    a small request of the same route, sent first (it loads the route's code: not the body's cost)."""

    name: str
    party: str
    what: str
    make: Callable[[dict], tuple[str, str, bytes, dict]]
    warm: Callable[[dict], tuple[str, str, bytes, dict]] | None = None
    follow: Callable[[Server, dict, Answer], None] | None = None  # e.g. waits for a job the body started
    answers: list = field(default_factory=list)


def _json_route(path: str, key: str, extra: dict | None = None) -> Callable:
    def make(state: dict, body: bytes) -> tuple[str, str, bytes, dict]:
        return "POST", path.format(**state), body, {"Authorization": f"Bearer {state[key]}",
                                                      "Content-Type": "application/json",
                                                      "Idempotency-Key": f"k{time.monotonic_ns()}", **(extra or {})}
    return make


def repeat_json(prefix: bytes, item: bytes, suffix: bytes, size: int) -> bytes:
    """``prefix item,item,…,item suffix`` of about ``size`` bytes."""
    count = max(1, (size - len(prefix) - len(suffix)) // (len(item) + 1))
    return prefix + b",".join([item] * count) + suffix


def ids_json(prefix: bytes, suffix: bytes, size: int) -> bytes:
    """A JSON list of distinct ids ("u0", "u1", …) of about ``size`` bytes, inside prefix/suffix."""
    parts, total, index = [], len(prefix) + len(suffix), 0
    while total < size:
        block = ",".join(f'"u{i}"' for i in range(index, index + 100_000)).encode()
        parts.append(block)
        total += len(block) + 1
        index += 100_000
    return prefix + b",".join(parts) + suffix


def columnar(path: str, media: str, key: str = "admin", query: str = "") -> Callable:
    def make(state: dict, body: bytes) -> tuple[str, str, bytes, dict]:
        return "POST" if "releases" in path else "PUT", path.format(**state) + query, body, {
            "Authorization": f"Bearer {state[key]}", "Content-Type": media,
            "Idempotency-Key": f"k{time.monotonic_ns()}"}
    return make


def cases() -> list[Case]:
    ten_million = 10_000_000

    def labels_bomb(_state):  # the review's bomb: 10⁷ dictionary-encoded rows of one id and one label
        return parquet_bytes(pa.table({"example_id": dictionary_column(ten_million, ["u0"]),
                                       "label": dictionary_column(ten_million, [1.0])}))

    def priors_bomb(state):
        k = state["classes_k"]
        return parquet_bytes(pa.table({"example_id": dictionary_column(ten_million, ["u0"]),
                                       **{f"p_{c}": dictionary_column(ten_million, [1.0]) for c in range(k)}}))

    def groups_bomb(_state):
        return parquet_bytes(pa.table({"example_id": dictionary_column(ten_million, ["u0"]),
                                       "group": dictionary_column(ten_million, ["g"])}))

    def understating(_state):  # one 64 MiB id in ~3 KB, the footer saying its chunk holds 200 bytes
        return understated(pa.table({"example_id": pa.array(["a" * (64 << 20)]), "label": pa.array([1])}))

    def number_pages(_state):  # issue 40's ninth review: 40 float64 pages of one value, each 256 MiB decompressed
        page = data_page(plain_doubles([1.0]) + bytes((256 << 20) - 8), 1, "zstd")
        ids = data_page(plain_strings([f"u{i}".encode() for i in range(40)]), 40)
        return parquet_file([Column("example_id", "byte_array", ids, 40),
                             Column("label", "double", page * 40, 40, "zstd")], rows=40)

    def old_writer(_state):  # the ninth review: a 32 MiB id hidden where Arrow pads the chunk of "parquet-mr 1.2.٩"
        hidden = data_page(plain_strings([b"a" * (32 << 20)]), 1, "brotli", level=5)
        return parquet_file([Column("example_id", "byte_array", data_page(plain_strings([b"u1"]), 1, "brotli"), 2,
                                    "brotli", extra=hidden),
                             Column("label", "double", data_page(plain_doubles([1.0, 2.0]), 2), 2)], rows=2,
                            created_by="parquet-mr version 1.2.\u0669")

    def long_ids(_state):  # 200,000 distinct 2,000-character ids, each named once: ~1 MB of zstd
        rows = 200_000
        ids = pa.array([("x" * 2000) + str(i) for i in range(rows)])
        return parquet_bytes(pa.table({"example_id": pa.DictionaryArray.from_arrays(
            pa.array(np.arange(rows, dtype=np.int32)), ids), "label": np.ones(rows)}))

    def honest_unique_ids(_state):  # an honest upload, as pyarrow writes it: 2·10⁶ new ids beside the N known
        rows = 2_000_000
        ids = [f"u{i}" for i in range(N)] + [f"user-{i:09d}" for i in range(rows)]
        return parquet_bytes(pa.table({"example_id": ids, "label": np.arange(len(ids), dtype=float) % 41}))

    def long_group_names(_state):  # 2·10⁶ rows naming 1,000 groups of 900 characters (issue 26's review)
        rows = 2_000_000
        return parquet_bytes(pa.table({
            "example_id": pa.array(np.char.add("u", np.arange(rows).astype(str))),
            "group": pa.DictionaryArray.from_arrays(pa.array(np.arange(rows) % 1000, pa.int32()),
                                                    pa.array(["g" * 900 + str(i) for i in range(1000)]))}))

    def long_astral_ids(columns: Callable[[int, dict], dict]) -> Callable:  # issue 40's eighteenth review
        def body(state) -> bytes:
            rows = 22_000
            ids = pa.array([("\U0001F600" + f"{i:08d}").ljust(3_997, "a") for i in range(rows)])
            buffer = io.BytesIO()
            pq.write_table(pa.table({"example_id": ids, **columns(rows, state)}), buffer, use_dictionary=False,
                           compression="zstd", compression_level=19, row_group_size=rows)
            return buffer.getvalue()
        return body

    def checks_of_ids(_state) -> bytes:  # 16 releases of distinct ids, 60 MB in all
        one = ids_json(b'{"mechanism": "rr", "epsilon": 1, "example_ids": [', b"]}", JSON_BYTES // 16)
        return b'{"releases": [' + b",".join([one] * 16) + b"]}"

    def deep_ndjson(columns: str) -> Callable:
        return lambda _state: (b'{"example_id": "u0", ' + columns.encode() + b', "x": ' + b"[" * 100_000 +
                               b"]" * 100_000 + b"}\n")

    def footer_bomb(_state):  # a footer of minimal column chunks (3 bytes each in Thrift, ~680 parsed)
        count = 170_000
        footer = (b"\x15\x02" + b"\x19\x1c\x48\x04root\x00" + b"\x16\x00" + b"\x19\x1c" + b"\x19\xfc" +
                  varint(count) + b"\x26\x00\x00" * count + b"\x16\x00\x16\x00\x00" + b"\x00")
        return b"PAR1" + footer + len(footer).to_bytes(4, "little") + b"PAR1"

    def wide_prior(k: str) -> Callable:  # one example, a one-hot prior over K classes (CSV)
        def make(state):
            classes = state[k]
            return ("example_id," + ",".join(f"p_{c}" for c in range(classes)) + "\nu0,1" + ",0" * (classes - 1)
                    + "\n").encode()
        return make

    ids_release = _json_route("/v1/datasets/{small}/releases", "admin")
    central = _json_route("/v1/datasets/{small}/central-trainings", "admin")
    evaluations = _json_route("/v1/datasets/{small}/evaluations", "admin")
    quantiles = _json_route("/v1/datasets/{small}/quantiles", "admin")
    datasets = _json_route("/v1/datasets", "admin")
    grants = _json_route("/v1/datasets/{small}/grants", "admin")
    jobs = _json_route("/v1/jobs", "trainer")
    pate = _json_route("/v1/datasets/{small}/pate-releases", "admin")
    pate_head = b'{"epsilon": 1, "example_ids": ["u0", "u1"], "features": [[0], [0]], "query_ids": ["q"], '

    def json_case(name: str, party: str, what: str, route, body: Callable[[dict], bytes], warm: bytes) -> Case:
        return Case(name, party, what, lambda state: route(state, body(state)), lambda state: route(state, warm))

    def columnar_case(name: str, what: str, route, body: Callable[[dict], bytes], warm: bytes) -> Case:
        return Case(name, "labels", what, lambda state: route(state, body(state)), lambda state: route(state, warm))

    def columnar_case_trainer(name: str, what: str, path: str, body: Callable[[dict], bytes], warm: bytes) -> Case:
        def route(state: dict, content: bytes) -> tuple[str, str, bytes, dict]:
            return "PUT", path, content, {"Authorization": f"Bearer {state['trainer']}", "Content-Type": "text/csv"}
        return Case(name, "trainer", what, lambda state: route(state, body(state)), lambda state: route(state, warm))

    nested = lambda prefix, suffix: (lambda _state: repeat_json(prefix, b"[0]", suffix, JSON_BYTES))  # noqa: E731
    at_limit = 1_700_000  # bytes of [[0],…] whose JsonCost is just under the default 192 MiB
    prior_query = "?epsilon=1.0"
    group_query = "?mechanism=rr-with-prior&epsilon=1.0&prior_epsilon=0.5"
    warm_csv = b"example_id,label\nnobody,99\n"  # out of the domain: refused, nothing stored
    return [
        json_case("datasets-nested-lists", "labels", "POST /v1/datasets: values [[0], [0], …], 60 MB", datasets,
                  nested(b'{"name": "n", "label_kind": "finite", "epsilon_total": 1, "values": [', b"]}"),
                  b'{"name": "n", "label_kind": "finite", "epsilon_total": 1, "values": [[0]]}'),
        json_case("datasets-deep-nesting", "labels", "POST /v1/datasets: values nested 100,000 deep (200 KB)",
                  datasets, lambda _s: b'{"name": "d", "label_kind": "finite", "values": ' + b"[" * 100_000 +
                  b"]" * 100_000 + b"}", b'{"name": "d", "label_kind": "finite", "values": [[]]}'),
        json_case("grants-nested-lists", "labels", "POST grants: epsilon [[0], …], 60 MB", grants,
                  nested(b'{"org": "o", "epsilon": [', b"]}"), b'{"org": "o", "epsilon": [[0]]}'),
        columnar_case("labels-parquet-bomb", "PUT labels: Parquet, 10^7 dictionary-encoded rows",
                      columnar("/v1/datasets/{small}/labels", "application/vnd.apache.parquet"), labels_bomb,
                      warm_csv),
        columnar_case("labels-parquet-understated", "PUT labels: Parquet, one 64 MiB id whose footer says 200 bytes",
                      columnar("/v1/datasets/{small}/labels", "application/vnd.apache.parquet"), understating,
                      warm_csv),
        columnar_case("labels-parquet-number-pages", "PUT labels: Parquet, 40 float64 pages of 256 MiB each in 330 KB",
                      columnar("/v1/datasets/{small}/labels", "application/vnd.apache.parquet"), number_pages,
                      warm_csv),
        columnar_case("labels-parquet-old-writer",
                      "PUT labels: Parquet by 'parquet-mr 1.2.\u0669', a page past its chunk",
                      columnar("/v1/datasets/{small}/labels", "application/vnd.apache.parquet"), old_writer,
                      warm_csv),
        columnar_case("labels-parquet-long-ids", "PUT labels: Parquet, 200,000 distinct 2,000-character ids",
                      columnar("/v1/datasets/{small}/labels", "application/vnd.apache.parquet"), long_ids, warm_csv),
        columnar_case("labels-parquet-honest", "PUT labels: Parquet, an honest upload of 2·10⁶ unique ids (pyarrow's "
                      "defaults: row groups of 2²⁰ rows, dictionary pages falling back to plain ones)",
                      columnar("/v1/datasets/{small}/labels", "application/vnd.apache.parquet"), honest_unique_ids,
                      warm_csv),
        columnar_case("labels-ndjson-deep", "PUT labels: NDJSON, one line nested 100,000 deep",
                      columnar("/v1/datasets/{small}/labels", "application/x-ndjson"),
                      deep_ndjson('"label": 1'), b'{"example_id": "nobody", "label": 99}\n'),
        json_case("releases-example-ids", "labels", "POST releases: example_ids, 60 MB of distinct ids",
                  ids_release, lambda _s: ids_json(b'{"mechanism": "rr", "epsilon": 1, "example_ids": [', b"]}",
                                                   JSON_BYTES),
                  b'{"mechanism": "rr", "epsilon": 1, "example_ids": ["nobody"]}'),
        json_case("releases-lone-surrogate", "labels", "POST releases: an example id holding a lone surrogate",
                  ids_release, lambda _s: b'{"mechanism": "rr", "epsilon": 1, "example_ids": ["u1", "\\ud800"]}',
                  b'{"mechanism": "rr", "epsilon": 1, "example_ids": ["nobody"]}'),
        json_case("central-features-lists", "labels", "POST central-trainings: features [[0], [0], …], 60 MB",
                  central, nested(b'{"epsilon": 1, "example_ids": ["u0", "u1"], "features": [', b"]}"),
                  b'{"epsilon": 1, "example_ids": ["u0", "u1"], "features": [[0]]}'),
        json_case("central-features-at-limit", "labels",
                  "POST central-trainings: features [[0], …] of 1.7 MB (just under the default decoded limit)",
                  central, lambda _s: repeat_json(b'{"epsilon": 1, "example_ids": ["u0", "u1"], "features": [',
                                                  b"[0]", b"]}", at_limit),
                  b'{"epsilon": 1, "example_ids": ["u0", "u1"], "features": [[0]]}'),
        json_case("pate-query-features-lists", "labels", "POST pate-releases: query_features [[0], …], 60 MB", pate,
                  nested(pate_head + b'"query_features": [', b"]}"), pate_head + b'"query_features": [[0]]}'),
        json_case("pate-query-features-at-limit", "labels",
                  "POST pate-releases: query_features [[0], …] of 1.7 MB (just under the default decoded limit)",
                  pate, lambda _s: repeat_json(pate_head + b'"query_features": [', b"[0]", b"]}", at_limit),
                  pate_head + b'"query_features": [[0]]}'),
        json_case("evaluations-predictions", "labels", "POST evaluations: predictions [0.5, …], 60 MB", evaluations,
                  lambda _s: repeat_json(b'{"metric": "mse", "epsilon": 1, "example_ids": ["u0"], "predictions": [',
                                         b"0.5", b"]}", JSON_BYTES),
                  b'{"metric": "mse", "epsilon": 1, "example_ids": ["u0"], "predictions": [0.5, 0.5]}'),
        json_case("quantiles-example-ids", "labels", "POST quantiles: example_ids, 60 MB of distinct ids", quantiles,
                  lambda _s: ids_json(b'{"quantiles": [0.5], "epsilon": 1, "example_ids": [', b"]}", JSON_BYTES),
                  b'{"quantiles": [0.5], "epsilon": 1, "example_ids": ["nobody"]}'),
        columnar_case("prior-parquet-bomb", "POST prior-releases: Parquet, 10^7 dictionary-encoded rows (K = 10)",
                      columnar("/v1/datasets/{classes}/prior-releases", "application/vnd.apache.parquet",
                               query=prior_query), priors_bomb, b"example_id,p_0\nnobody,1\n"),
        columnar_case("prior-parquet-footer-bomb", "POST prior-releases: a 510 KB Parquet footer of 170,000 "
                      "minimal column chunks (Thrift)", columnar("/v1/datasets/{classes}/prior-releases",
                                                                 "application/vnd.apache.parquet", query=prior_query),
                      footer_bomb, b"example_id,p_0\nnobody,1\n"),
        columnar_case("labels-parquet-footer-bomb", "PUT labels: a 510 KB Parquet footer of 170,000 minimal column "
                      "chunks (Thrift)", columnar("/v1/datasets/{small}/labels", "application/vnd.apache.parquet"),
                      footer_bomb, warm_csv),
        columnar_case("prior-ndjson-deep", "POST prior-releases: NDJSON, one line nested 100,000 deep",
                      columnar("/v1/datasets/{classes}/prior-releases", "application/x-ndjson", query=prior_query),
                      deep_ndjson('"p_0": 1'), b'{"example_id": "nobody", "p_0": 1}\n'),
        columnar_case("prior-wide-10k", "POST prior-releases: one-hot prior over 10,000 classes (CSV, 89 KB)",
                      columnar("/v1/datasets/{wide10k}/prior-releases", "text/csv", query=prior_query),
                      wide_prior("wide10k_k"), b"example_id,p_0\nnobody,1\n"),
        columnar_case("prior-wide-100k", "POST prior-releases: one-hot prior over 100,000 classes (CSV, 1 MB)",
                      columnar("/v1/datasets/{wide100k}/prior-releases", "text/csv", query=prior_query),
                      wide_prior("wide100k_k"), b"example_id,p_0\nnobody,1\n"),
        columnar_case("prior-wide-100k-ndjson", "POST prior-releases: one-hot prior over 100,000 classes (NDJSON, "
                      "1.4 MB)", columnar("/v1/datasets/{wide100k}/prior-releases", "application/x-ndjson",
                                          query=prior_query),
                      lambda s: json_body({"example_id": "u0", **{f"p_{c}": int(c == 0) for c in
                                                                  range(s["wide100k_k"])}}) + b"\n",
                      b'{"example_id": "nobody", "p_0": 1}\n'),
        columnar_case("prior-ndjson-many-keys", "POST prior-releases: NDJSON rows of 100,000 keys beyond the "
                      "columns read (1.5 MB)", columnar("/v1/datasets/{classes}/prior-releases",
                                                        "application/x-ndjson", query=prior_query),
                      lambda s: json_body({"example_id": "u0", **{f"p_{c}": 1 for c in range(s["classes_k"])},
                                           **{f"junk{c}": 0 for c in range(100_000)}}) + b"\n",
                      b'{"example_id": "nobody", "p_0": 1}\n'),
        columnar_case("groups-csv-many-columns", "POST group-releases: CSV of 100,000 columns beyond the two read "
                      "(0.9 MB)", columnar("/v1/datasets/{classes}/group-releases", "text/csv", query=group_query),
                      lambda _s: ("example_id,group," + ",".join(f"j{c}" for c in range(100_000)) + "\nu0,a" +
                                  ",0" * 100_000 + "\n").encode(), b"example_id,group\nnobody,a\n"),
        columnar_case("groups-long-ids", "POST group-releases: Parquet, 22,000 distinct ids of 4,000 bytes, one "
                      "character outside the BMP each (~235 KB)",
                      columnar("/v1/datasets/{classes}/group-releases", "application/vnd.apache.parquet",
                               query=group_query), long_astral_ids(lambda rows, _s: {"group": ["g"] * rows}),
                      b"example_id,group\nnobody,a\n"),
        columnar_case("priors-long-ids", "POST prior-releases: Parquet, 22,000 distinct ids of 4,000 bytes, one "
                      "character outside the BMP each",
                      columnar("/v1/datasets/{classes}/prior-releases", "application/vnd.apache.parquet",
                               query=prior_query), long_astral_ids(lambda rows, s: {f"p_{c}": np.ones(rows)
                                                                for c in range(s["classes_k"])}),
                      b"example_id,p_0\nnobody,1\n"),
        json_case("release-checks-ids", "labels", "POST release-checks: 16 releases naming 3.75 MB of ids each "
                  "(60 MB)", _json_route("/v1/datasets/{small}/release-checks", "admin"), checks_of_ids,
                  b'{"releases": [{"mechanism": "rr", "epsilon": 1, "example_ids": ["nobody"]}]}'),
        columnar_case("groups-parquet-bomb", "POST group-releases: Parquet, 10^7 dictionary-encoded rows",
                      columnar("/v1/datasets/{classes}/group-releases", "application/vnd.apache.parquet",
                               query=group_query), groups_bomb, b"example_id,group\nnobody,a\n"),
        columnar_case("groups-long-names", "POST group-releases: Parquet, 2*10^6 rows of 1,000 900-character names",
                      columnar("/v1/datasets/{classes}/group-releases", "application/vnd.apache.parquet",
                               query=group_query), long_group_names, b"example_id,group\nnobody,a\n"),
        json_case("jobs-example-ids", "trainer", "POST /v1/jobs: release.example_ids, 60 MB of distinct ids", jobs,
                  lambda s: ids_json(json.dumps({"features": "f", "dataset_id": s["classes"], "api_key": s["admin"],
                                                 "release": {"mechanism": "rr", "epsilon": 1.0}}
                                                )[:-2].encode() + b', "example_ids": [', b"]}}", JSON_BYTES),
                  b'{"features": "nope"}'),
        json_case("jobs-nested-lists", "trainer", "POST /v1/jobs: numeric [[0], [0], …], 60 MB", jobs,
                  nested(b'{"features": "f", "numeric": [', b"]}"), b'{"features": "nope"}'),
        columnar_case_trainer("id-lists-short-ids", "PUT /v1/id-lists: 60 MB CSV of distinct short ids (any key may "
                              "upload one)", "/v1/id-lists/h",
                              lambda _s: _csv_ids("example_id\n", "", JSON_BYTES), b"example_id\nnobody\nnobody\n"),
        columnar_case_trainer("features-short-rows", "PUT /v1/features: 60 MB CSV of short rows (admin keys)",
                              "/v1/features/g", lambda _s: _csv_ids("example_id,x\n", ",1", JSON_BYTES),
                              b"example_id,x\nnobody,1\nnobody,1\n"),
        columnar_case_trainer("features-header-commas", "PUT /v1/features: a header of 1 MiB of commas (10⁶ empty "
                              "column names)", "/v1/features/g",
                              lambda _s: b"example_id" + b"," * ((1 << 20) - 20) + b"\n", b"example_id,x\nnobody,1\n"
                              b"nobody,1\n"),
        columnar_case_trainer("features-header-repeated", "PUT /v1/features: a header of 60,000 names 'a'",
                              "/v1/features/g", lambda _s: b"example_id" + b",a" * 60_000 + b"\n",
                              b"example_id,x\nnobody,1\nnobody,1\n"),
        columnar_case_trainer("features-widest-legal", "PUT /v1/features: 1 MB of 3,999 numeric columns (the default "
                              "max_feature_columns) × 118 rows, stored", "/v1/features/w",
                              lambda _s: b"example_id," + b",".join(b"c%d" % i for i in range(3_999)) + b"\n" +
                              b"".join(b"w%d" % r + b",0" * 3_999 + b"\n" for r in range(118)),
                              b"example_id,x\nnobody,1\nnobody,1\n"),
        columnar_case_trainer("id-lists-mixed-endings", "PUT /v1/id-lists: 2·10⁶ ids ended by turns in a lone \\r and "
                              "a lone \\n (twice the limit)", "/v1/id-lists/m",
                              lambda _s: b"example_id\n" + b"".join(b"%030d" % i + (b"\r" if i % 2 else b"\n")
                                                                    for i in range(2_000_000)),
                              b"example_id\nnobody\nnobody\n"),
        columnar_case_trainer("id-lists-at-limit", "PUT /v1/id-lists: 999,999 ids of 30 characters (within every "
                              "limit), stored", "/v1/id-lists/l",
                              lambda _s: b"example_id\n" + b"".join(b"%030d\n" % i for i in range(999_999)),
                              b"example_id\nnobody\nnobody\n"),
        Case("jobs-mlp-1e8", "trainer", "POST /v1/jobs: an MLP of 8 hidden layers of 4,096 (1.2*10^8 parameters) "
             "on 10 rows", lambda s: jobs(s, json_body(_mlp_job(s, [4096] * 8))),
             lambda s: jobs(s, b'{"features": "nope"}'), follow=_wait_for_job),
    ]


def _csv_ids(header: str, rest: str, size: int) -> bytes:
    """A CSV of about ``size`` bytes: distinct ids u0, u1, … each followed by ``rest``."""
    parts, total, index = [header.encode()], len(header), 0
    while total < size:
        block = "".join(f"u{i}{rest}\n" for i in range(index, index + 100_000)).encode()
        parts.append(block)
        total += len(block)
        index += 100_000
    return b"".join(parts)


def _mlp_job(state: dict, hidden: list[int]) -> dict:
    return {"features": "f", "dataset_id": state["classes"], "api_key": state["admin"], "numeric": ["x0"],
            "release": {"mechanism": "rr", "epsilon": 1.0, "example_ids": [f"u{i}" for i in range(10)]},
            "train": {"hidden": hidden, "epochs": 1, "batch_size": 16, "patience": 1}, "estimate_fraction": 0}


def _wait_for_job(server: Server, state: dict, answer: Answer) -> None:
    """A job the body started: until it finishes (or 120 s): its training is the body's cost."""
    if answer.status != 202:
        return
    job = answer.json()["id"]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and server.process.poll() is None:
        view = request(server.port, "GET", f"/v1/jobs/{job}", headers={"Authorization": f"Bearer {state['trainer']}"})
        if view.status == 200 and view.json()["status"] in ("succeeded", "failed"):
            return
        time.sleep(1)


# -- setup and measurement ------------------------------------------------------------------------------------------

def setup(deployment: Deployment) -> dict:
    """Keys, datasets (1,000 examples each: an integer one with central training allowed, classes of 10, 10,000
    and 100,000; "large", classes of 10 on :data:`LARGE_N` examples) and the trainer's features table."""
    admin = json.loads(deployment.cli("labels", "create-key", "--database-url", deployment.labels_url, "--data-dir",
                                      str(deployment.work / "data"), "--org", "owner", "--role", "admin",
                                      "--json"))["key"]
    consumer = json.loads(deployment.cli("labels", "create-key", "--database-url", deployment.labels_url,
                                         "--data-dir", str(deployment.work / "data"), "--org", "other", "--role",
                                         "consumer", "--json"))["key"]
    trainer_key = json.loads(deployment.cli("features", "create-key", "--database-url", deployment.trainer_url,
                                            "--data-dir", str(deployment.work / "trainer"), "--org", "owner",
                                            "--role", "admin", "--json"))["key"]
    state = {"admin": admin, "consumer": consumer, "trainer": trainer_key, "classes_k": 10, "wide10k_k": 10_000,
             "wide100k_k": 100_000}
    headers = {"Authorization": f"Bearer {admin}", "Content-Type": "application/json"}
    ids = [f"u{i}" for i in range(N)]
    with deployment.serve("labels", "setup-labels.log") as server:
        specs = {"small": {"label_kind": "integer", "min": 0, "max": 40, "allow_central_training": True},
                 "classes": {"label_kind": "classes", "num_classes": 10},
                 "wide10k": {"label_kind": "classes", "num_classes": 10_000},
                 "wide100k": {"label_kind": "classes", "num_classes": 100_000},
                 "large": {"label_kind": "classes", "num_classes": 10}}
        for name, spec in specs.items():
            made = request(server.port, "POST", "/v1/datasets", json_body(
                {"name": name, "epsilon_total": 1000, **spec}), headers)
            assert made.status in (200, 201), made.body
            state[name] = made.json()["id"]
            count = LARGE_N if name == "large" else N
            labels = ("example_id,label\n" + "".join(f"u{n},{n % 10}\n" for n in range(count))).encode()
            done = request(server.port, "PUT", f"/v1/datasets/{state[name]}/labels", labels,
                           {"Authorization": f"Bearer {admin}", "Content-Type": "text/csv"}, timeout=600)
            assert done.status == 200, done.body
        granted = request(server.port, "POST", f"/v1/datasets/{state['large']}/grants", json_body(
            {"org": "other", "epsilon": 100}), headers)  # another organization's bodies beside the owner's
        assert granted.status in (200, 201), granted.body
    with deployment.serve("labels", "setup-labels-2.log"), deployment.serve("trainer", "setup-trainer.log") as trainer:
        features = ("example_id,x0\n" + "\n".join(f"{i},{n % 7}" for n, i in enumerate(ids)) + "\n").encode()
        done = request(trainer.port, "PUT", "/v1/features/f", features,
                       {"Authorization": f"Bearer {trainer_key}", "Content-Type": "text/csv"})
        assert done.status == 200, done.body
    return state


def measure(deployment: Deployment, case: Case, state: dict) -> dict:
    method, path, body, headers = case.make(state)
    result: dict = {"name": case.name, "route": f"{method} {path.split('?')[0]}", "what": case.what,
                    "body_bytes": len(body)}
    with contextlib.ExitStack() as stack:
        if case.party == "trainer":
            stack.enter_context(deployment.serve("labels", f"{case.name}-labels.log"))
        server = stack.enter_context(deployment.serve(case.party, f"{case.name}.log"))
        if case.warm is not None:
            method_w, path_w, body_w, headers_w = case.warm(state)
            warm = request(server.port, method_w, path_w, body_w, headers_w)
            result["warm_status"] = warm.status
        time.sleep(0.5)
        baseline = status_field(server.pid, "VmRSS")
        Path(f"/proc/{server.pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
        cpu = cpu_seconds(server.pid)
        answer = request(server.port, method, path, body, headers, timeout=300)
        if case.follow is not None:
            case.follow(server, state, answer)
        time.sleep(0.5)
        alive = server.process.poll() is None
        if alive:
            peak, cpu_used = status_field(server.pid, "VmHWM"), cpu_seconds(server.pid) - cpu
        else:
            peak, cpu_used = None, None
        document = answer.json()
        error = document.get("error") if isinstance(document, dict) else None
        message = error.get("message") if isinstance(error, dict) else None
        result.update({"status": answer.status, "code": answer.code, "message": (message or answer.error or "")[:300],
                       "seconds": round(answer.seconds, 3), "server_alive": alive,
                       "server_exit_code": None if alive else server.process.returncode,
                       "baseline_rss_mb": round(baseline / 1024, 1),
                       "peak_rss_growth_mb": None if peak is None else round((peak - baseline) / 1024, 1),
                       "cpu_seconds": None if cpu_used is None else round(cpu_used, 2)})
    result["checks"] = {
        "alive": alive,
        "rss_growth_within_256_mb": alive and result["peak_rss_growth_mb"] <= RSS_LIMIT_MB,
        "cpu_within_2_s": (None if len(body) > SMALL_BODY else bool(alive and result["cpu_seconds"] <= CPU_LIMIT_S)),
    }
    return result


def four_at_once(deployment: Deployment, state: dict, name: str, make: Callable[[dict], tuple], *,
                 warm: bytes = b'{"epsilon": 1, "example_ids": ["u0", "u1"], "features": [[0]]}',
                 limit_mb: float = FOUR_LIMIT_MB, env: dict | None = None, keys: tuple[str, ...] = ()) -> dict:
    """Four copies of one body at once on one server (after one ``warm`` body of its route): its peak RSS growth,
    within ``limit_mb``. ``keys``: the copies' keys in turn (by default the body's own)."""
    with deployment.serve("labels", f"four-{name}.log", env) as server:
        method, path, body, headers = make(state)
        request(server.port, method, path, warm, {**headers, "Idempotency-Key": "warm"})
        time.sleep(0.5)
        baseline = status_field(server.pid, "VmRSS")
        Path(f"/proc/{server.pid}/clear_refs").write_text("5")
        cpu = cpu_seconds(server.pid)
        answers: list[Answer] = [Answer(None)] * 4

        def send(index: int) -> None:
            key = {"Authorization": f"Bearer {state[keys[index % len(keys)]]}"} if keys else {}
            answers[index] = request(server.port, method, path, body, {**headers, **key,
                                                                        "Idempotency-Key": f"four{index}"},
                                     timeout=600)

        threads = [threading.Thread(target=send, args=(i,)) for i in range(4)]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        seconds = time.perf_counter() - started
        time.sleep(0.5)
        alive = server.process.poll() is None
        peak = status_field(server.pid, "VmHWM") if alive else None
        growth = None if peak is None else round((peak - baseline) / 1024, 1)
        return {"name": name, "route": f"{method} {path}", "body_bytes": len(body), "copies": 4,
                "answers": [[a.status, a.code] for a in answers], "seconds": round(seconds, 2),
                "server_alive": alive, "baseline_rss_mb": round(baseline / 1024, 1), "peak_rss_growth_mb": growth,
                "cpu_seconds": round(cpu_seconds(server.pid) - cpu, 2) if alive else None,
                "checks": {"alive": alive, f"rss_growth_within_{limit_mb:g}_mb": bool(alive and growth <= limit_mb)}}


def _groups_at_bound(state: dict) -> tuple:
    """An honest CSV group body at the default bound: :data:`AT_BOUND_ROWS` of the large dataset's ids, 100 groups."""
    body = ("example_id,group\n" + "".join(f"u{n},g{n % 100}\n" for n in range(AT_BOUND_ROWS))).encode()
    return ("POST", f"/v1/datasets/{state['large']}/group-releases?mechanism=rr-with-prior&epsilon=1.0"
                    "&prior_epsilon=0.5", body,
            {"Authorization": f"Bearer {state['admin']}", "Content-Type": "text/csv"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--only", help="comma-separated case names ('four': both cases of four bodies at once)")
    parser.add_argument("--root", type=Path, default=HERE, help="the checkout whose services run")
    args = parser.parse_args()
    only = set(args.only.split(",")) if args.only else None
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=args.root, capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=args.root,
                                capture_output=True, text=True).stdout.strip())
    results, together = [], []
    with tempfile.TemporaryDirectory(prefix="labeldp-hostile-") as directory:
        deployment = Deployment(args.root.resolve(), Path(directory))
        state = setup(deployment)
        for case in cases():
            if only is None or case.name in only:
                results.append(measure(deployment, case, state))
                print(json.dumps(results[-1]), file=sys.stderr)
        if only is None or any(name.startswith("four") for name in only):
            central = lambda s: ("POST", f"/v1/datasets/{s['small']}/central-trainings",  # noqa: E731
                                 repeat_json(b'{"epsilon": 1, "example_ids": ["u0", "u1"], "features": [', b"[0]",
                                             b"]}", JSON_BYTES),
                                 {"Authorization": f"Bearer {s['admin']}", "Content-Type": "application/json"})
            at_limit = lambda s: ("POST", f"/v1/datasets/{s['small']}/central-trainings",  # noqa: E731
                                  repeat_json(b'{"epsilon": 1, "example_ids": ["u0", "u1"], "features": [', b"[0]",
                                              b"]}", 1_700_000),
                                  {"Authorization": f"Bearer {s['admin']}", "Content-Type": "application/json"})
            for name, make in (("four-central-features-60mb", central), ("four-central-features-at-limit", at_limit)):
                if only is not None and name not in only and "four" not in only:
                    continue
                together.append(four_at_once(deployment, state, name, make))
                print(json.dumps(together[-1]), file=sys.stderr)
            if only is None or {"four", "four-groups-at-bound"} & only:
                # two organizations, two bodies each (their two release slots); honest bodies count within 1.25
                # times their count (docs/results/hostile-reviews.md, 19th review)
                together.append(four_at_once(deployment, state, "four-groups-at-bound", _groups_at_bound,
                                             warm=b"example_id,group\nu1,a\n", limit_mb=1.3 * COLUMNAR_BUDGET_MB,
                                             keys=("admin", "consumer")))
                print(json.dumps(together[-1]), file=sys.stderr)
    checks = [value for r in results + together for value in r["checks"].values() if value is not None]
    document = {"bench": "hostile_bodies", "root": str(args.root.resolve()), "commit": commit, "dirty": dirty,
                "cpus": os.cpu_count(), "load_average": os.getloadavg(),
                "limits": {"rss_growth_mb_each": RSS_LIMIT_MB, "rss_growth_mb_four": FOUR_LIMIT_MB,
                           "cpu_seconds_small_body": CPU_LIMIT_S, "small_body_bytes": SMALL_BODY},
                "bodies": results, "four_at_once": together, "all_checks_pass": all(checks)}
    if args.json:
        print(json.dumps(document, indent=1))
    else:
        for r in results + together:
            print(f"{r['name']:32} {str(r.get('status') or r.get('answers')):>12} {r.get('code') or '':22} "
                  f"rss +{r['peak_rss_growth_mb']} MB  cpu {r['cpu_seconds']} s  {r['seconds']} s")
        print("all checks pass" if document["all_checks_pass"] else "SOME CHECKS FAIL")


if __name__ == "__main__":
    main()
