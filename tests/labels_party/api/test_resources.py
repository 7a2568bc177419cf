"""Running out of resources is the service's condition, never the client's fault and never a 500 (issue 28, item 6).

A full disk is real here: the database and the data directory live on a small tmpfs mounted for the test (root only;
skipped with the reason otherwise), filled with a filler file. Every refusal is 507 ``insufficient_storage`` and changes
nothing (no label version, no charge, no grant); a source's copy, made by its registration's job, fails its dataset with
that code and leaves no copy; with space again, the same request succeeds. A disk that fills after a release's charge
leaves it failed and charged (503 ``release_failed``). Running out of file descriptors is real too (the process's own
limit, lowered for one request): 503 ``resource_exhausted``. A PostgreSQL tablespace on a full tmpfs: 507 (when
LABELDP_TEST_POSTGRES_URL names a local server). ~6 s.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import resource
import subprocess
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fastapi.testclient import TestClient

from labels_party.http.api import create_app
from labels_party.http.auth import create_key
from labels_party.runtime.context import make_context
from labels_party.runtime.settings import LabelsSettings
from labels_party.store import db
from shared.errors import resource_error
from tests.labels_party.api.helpers import bearer, expect_error, new_dataset, release, state, upload

pytestmark = pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient`")

DISK_MB = 24


@pytest.fixture
def small_disk(tmp_path):
    """A tmpfs of DISK_MB mounted for this test, unmounted after it."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_MB}m,mode=0700", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs to fill (needs root or CAP_SYS_ADMIN): {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _free(path: Path) -> int:
    status = os.statvfs(path)
    return status.f_bavail * status.f_frsize


@contextlib.contextmanager
def _filled(disk: Path, leave: int = 0):
    """The disk filled but for about ``leave`` bytes, for the duration of the block."""
    filler = disk / f"filler-{uuid.uuid4().hex}"
    try:
        with open(filler, "wb") as handle:
            block = b"\0" * (1 << 20)
            while _free(disk) > leave + len(block):
                handle.write(block)
            with contextlib.suppress(OSError):
                handle.write(b"\0" * max(0, _free(disk) - leave))
                handle.flush()
        yield filler
    finally:
        filler.unlink(missing_ok=True)


def _service(disk: Path, sources: Path | None = None):
    # (the disk's own limits are under test: the organizations' storage quotas, a quarter of this small disk by
    # default, are set out of the way — tests/shared/service/test_storage_quota.py tests them)
    settings = LabelsSettings(database_url=f"sqlite:///{disk}/db.sqlite", data_dir=disk / "data",
                              spark_sources={"hospital": [f"{sources}/"]} if sources else {}, job_retry_seconds=0,
                              max_stored_bytes_per_org=1 << 40)
    ctx = make_context(settings=settings)
    with ctx.sessions() as session, session.begin():
        admin = create_key(ctx.ledger, session, "hospital", "admin")
        consumer = create_key(ctx.ledger, session, "publisher", "consumer")
    return TestClient(create_app(ctx), raise_server_exceptions=False), bearer(admin), bearer(consumer)


def _csv(n: int, offset: int = 0) -> bytes:
    """n labels with 64-character ids: random-looking text that compresses little."""
    return ("example_id,label\n" + "".join(f"{hashlib.sha256(b'%d' % i).hexdigest()},{i % 52 + 1}\n"
                                           for i in range(offset, offset + n))).encode()


def _leftovers(disk: Path) -> list[str]:
    """Files under the data directory's scratch space (spools, staged uploads, DuckDB spills)."""
    return sorted(str(p.relative_to(disk)) for p in (disk / "data" / "tmp").rglob("*")
                  if p.is_file() and "spool" not in p.parts and p.name != "live.lock")


def test_an_upload_onto_a_full_disk_is_507_and_leaves_no_version(small_disk):
    client, admin, _ = _service(small_disk)
    with client:
        dataset = new_dataset(client, admin, name="weeks", label_kind="integer", min=1, max=52, epsilon_total=5)
        assert upload(client, admin, dataset, _csv(1000)).status_code == 200
        before = state(client, admin, dataset)
        body = _csv(60_000, offset=500)  # 4.9 MB: its staged Parquet copy does not fit beside it
        with _filled(small_disk, leave=len(body) + (256 << 10)):
            refused = expect_error(upload(client, admin, dataset, body), 507, "insufficient_storage")
            assert refused["message"] == "the service's storage is full; nothing was changed, try again later"
            assert state(client, admin, dataset) == before
            assert _leftovers(small_disk) == []
            # a body larger than the free space fails while it is spooled: the same answer
            expect_error(upload(client, admin, dataset, body + body), 507, "insufficient_storage")
            assert state(client, admin, dataset) == before
        accepted = upload(client, admin, dataset, body)  # with space again, the same body is taken
        assert accepted.status_code == 200, accepted.text
        assert (accepted.json()["label_version"], accepted.json()["new_examples"]) == (2, 59_500)


def test_releases_and_grants_onto_a_full_disk_are_507_and_charge_nothing(small_disk):
    client, admin, consumer = _service(small_disk)
    with client:
        dataset = new_dataset(client, admin, name="weeks", label_kind="integer", min=1, max=52, epsilon_total=5)
        assert upload(client, admin, dataset, _csv(20_000)).status_code == 200
        before = state(client, admin, dataset)
        with _filled(small_disk):
            expect_error(release(client, admin, dataset, "full", mechanism="rr", epsilon=1), 507,
                         "insufficient_storage")
            expect_error(client.post(f"/v1/datasets/{dataset}/grants", headers=admin,
                                     json={"org": "publisher", "epsilon": 1}), 507, "insufficient_storage")
            assert state(client, admin, dataset) == before
            assert client.get(f"/v1/datasets/{dataset}/budget", headers=consumer).status_code == 404  # no grant
        charged = release(client, admin, dataset, "full", mechanism="rr", epsilon=1)  # the same key, with space
        assert charged.status_code == 201, charged.text
        assert state(client, admin, dataset)["epsilon_spent"] == 1.0


def test_a_source_copied_onto_a_full_disk_fails_its_registration_and_registers_nothing(small_disk, tmp_path):
    """The copy runs in the registration's job: on a full disk each attempt fails with insufficient_storage and
    leaves nothing; after the last one the dataset is failed with that code, and the same request sent again once
    there is space queues its registration again (not run here: Spark would keep its scratch on this tmpfs)."""
    sources = tmp_path / "sources"
    (sources / "weeks").mkdir(parents=True)
    ids = [hashlib.sha256(b"%d" % i).hexdigest() for i in range(100_000)]
    pq.write_table(pa.table({"example_id": ids, "label": [i % 52 + 1 for i in range(100_000)]}),
                   sources / "weeks" / "part-0.parquet", compression="none")
    client, admin, _ = _service(small_disk, sources)
    ctx = client.app.state.ctx
    body = {"name": "weeks", "label_kind": "integer", "min": 1, "max": 52, "epsilon_total": 5,
            "source": f"{sources}/weeks"}
    with client:
        with _filled(small_disk, leave=1 << 20):  # the source is 7 MB
            response = client.post("/v1/datasets", json=body, headers=admin)
            if response.status_code == 400 and response.json()["error"]["code"] == "source_not_allowed":
                pytest.skip(f"no Spark on this machine: {response.json()['error']['message']}")
            assert response.status_code == 202, response.text
            assert ctx.jobs.run_pending() == ctx.settings.job_max_attempts  # retried: the disk may free up
            failed = client.get(response.headers["location"], headers=admin).json()
            assert failed["state"] == "failed" and failed["error"]["code"] == "insufficient_storage", failed
            assert failed["num_examples"] == 0
            assert not (small_disk / "data" / "sources").exists()  # the partial copies removed
            assert list((small_disk / "data" / "tmp" / "jobs").iterdir()) == []
        again = client.post("/v1/datasets", json=body, headers=admin)  # with space, the same registration
        assert again.status_code == 202 and again.json()["id"] == failed["id"], again.text
        assert again.json()["state"] == "registering" and again.json()["error"] is None
        with ctx.sessions() as session:
            job = session.query(db.Job).one()
            assert (job.state, job.attempts, job.error_code) == ("queued", 0, None)


def test_a_body_that_quotes_a_resource_error_is_still_the_clients(tmp_path):
    """A parser's message quotes the body: words in it never make a malformed file the service's condition."""
    ctx = make_context(f"sqlite:///{tmp_path}/db.sqlite", tmp_path / "data")
    with ctx.sessions() as session, session.begin():
        admin = bearer(create_key(ctx.ledger, session, "hospital", "admin"))
    with TestClient(create_app(ctx), raise_server_exceptions=False) as client:
        dataset = new_dataset(client, admin, name="weeks", label_kind="integer", min=1, max=52, epsilon_total=5)
        for body in (b"example_id,label\nNo space left on device\n", b"example_id,label\na,Too many open files\n"):
            expect_error(upload(client, admin, dataset, body), 400, "malformed_file")


def test_out_of_descriptors_is_503(tmp_path):
    """The process's descriptor limit lowered to what it holds, for one upload: the body cannot be spooled."""
    ctx = make_context(f"sqlite:///{tmp_path}/db.sqlite", tmp_path / "data")
    with ctx.sessions() as session, session.begin():
        admin = bearer(create_key(ctx.ledger, session, "hospital", "admin"))
    with TestClient(create_app(ctx), raise_server_exceptions=False) as client:
        dataset = new_dataset(client, admin, name="weeks", label_kind="integer", min=1, max=52, epsilon_total=5)
        before = state(client, admin, dataset)
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        held: list[int] = []
        try:
            highest = max(int(fd) for fd in os.listdir("/proc/self/fd"))
            resource.setrlimit(resource.RLIMIT_NOFILE, (highest + 1, hard))
            with contextlib.suppress(OSError):  # fill the gaps below the limit
                while True:
                    held.append(os.open(os.devnull, os.O_RDONLY))
            response = upload(client, admin, dataset, _csv(10))
        finally:
            for fd in held:
                os.close(fd)
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        error = expect_error(response, 503, "resource_exhausted")
        assert error["message"] == "the service has too many open files; nothing was changed, try again later"
        assert state(client, admin, dataset) == before
        assert upload(client, admin, dataset, _csv(10)).status_code == 200


def test_resource_errors_are_recognized_from_what_libraries_raise():
    """The errors libraries raise when a resource runs out, made for real where this process can."""
    import duckdb

    assert resource_error(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))).code == "insufficient_storage"
    assert resource_error(OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))).code == "insufficient_storage"
    assert resource_error(OSError(errno.EMFILE, os.strerror(errno.EMFILE))).code == "resource_exhausted"
    connection = duckdb.connect(config={"memory_limit": "8MB", "threads": 1})
    with pytest.raises(duckdb.Error) as out_of_memory:  # no temp directory: it cannot spill
        connection.execute("SELECT list(range) FROM range(10000000)").fetchall()
    assert resource_error(out_of_memory.value).code == "resource_exhausted"
    with pytest.raises(MemoryError) as too_much:
        bytearray(1 << 62)
    assert resource_error(too_much.value).code == "resource_exhausted"
    for ordinary in (OSError(errno.ENOENT, "No such file or directory"), ValueError("bad"),
                     OSError("No space in the header"),
                     pa.ArrowInvalid("CSV parse error: Expected 2 columns, got 1: No space left on device")):
        assert resource_error(ordinary) is None


def test_the_openapi_documents_resource_refusals(tmp_path):
    ctx = make_context(f"sqlite:///{tmp_path}/db.sqlite", tmp_path / "data")
    paths = TestClient(create_app(ctx)).get("/openapi.json").json()["paths"]
    for path, method in [("/v1/datasets/{dataset_id}/labels", "put"), ("/v1/datasets", "post"),
                         ("/v1/datasets/{dataset_id}/releases", "post"), ("/v1/datasets/{dataset_id}/grants", "post"),
                         ("/v1/datasets/{dataset_id}/group-releases", "post"),
                         ("/v1/mechanisms/{mechanism_hash}", "get")]:
        responses = paths[path][method]["responses"]
        assert "insufficient_storage" in responses["507"]["description"], path
        assert "resource_exhausted" in responses["503"]["description"], path
        assert responses["507"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorBody")


def test_a_disk_that_fills_after_the_charge_leaves_the_release_failed_and_charged(small_disk):
    """Room for the charge (the ledger's files and rows: ~0.3 MB) but not for the labels (~2.2 MB): the release is
    charged, then fails — 503 release_failed, the same answer whatever the cause (whether a disk fills while the
    privatized labels are written depends on their compressed size, a function of the data) — and a retry with
    its key answers the stored failure without a second charge."""
    client, admin, _ = _service(small_disk)
    with client:
        dataset = new_dataset(client, admin, name="weeks", label_kind="integer", min=1, max=52, epsilon_total=5)
        assert upload(client, admin, dataset, _csv(60_000)).status_code == 200
        with _filled(small_disk, leave=1 << 20):
            failed = expect_error(release(client, admin, dataset, "late", mechanism="rr", epsilon=1), 503,
                                  "release_failed")
            assert "No space" not in failed["message"] and "storage" not in failed["message"]
            assert state(client, admin, dataset)["epsilon_spent"] == 1.0
        expect_error(release(client, admin, dataset, "late", mechanism="rr", epsilon=1), 503, "release_failed")
        assert state(client, admin, dataset)["epsilon_spent"] == 1.0


def test_a_full_postgresql_tablespace_is_507_and_charges_nothing(tmp_path):
    """The ledger's rows on PostgreSQL, whose database lives in a tablespace on a small tmpfs: once the tablespace
    is full, the request that cannot extend a table is 507 (disk_full, SQLSTATE 53100) and charges nothing; every
    release before it was charged exactly once."""
    import pwd

    from sqlalchemy import create_engine, text

    from tests.support.databases import POSTGRES_URL

    if not POSTGRES_URL or not any(host in POSTGRES_URL for host in ("@127.0.0.1", "@localhost")):
        pytest.skip("needs LABELDP_TEST_POSTGRES_URL naming a PostgreSQL server on this machine")
    try:
        postgres = pwd.getpwnam("postgres")
    except KeyError:
        pytest.skip("no 'postgres' system user to own the tablespace's directory")
    name = f"labeldp_full_{uuid.uuid4().hex[:10]}"
    mount = Path(f"/tmp/{name}")  # PostgreSQL's user must reach it: not under pytest's 0700 directories
    mount.mkdir(mode=0o755)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0755", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        mount.rmdir()
        pytest.skip(f"cannot mount a tmpfs to fill (needs root or CAP_SYS_ADMIN): {done.stderr.strip()}")
    admin_engine = create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    try:
        (mount / "space").mkdir()
        os.chown(mount / "space", postgres.pw_uid, postgres.pw_gid)
        with admin_engine.connect() as connection:
            connection.execute(text(f"CREATE TABLESPACE {name} LOCATION '{mount}/space'"))
            connection.execute(text(f'CREATE DATABASE "{name}" TABLESPACE {name}'))
        ctx = make_context(POSTGRES_URL.rsplit("/", 1)[0] + "/" + name, tmp_path / "data")
        with ctx.sessions() as session, session.begin():
            admin = bearer(create_key(ctx.ledger, session, "hospital", "admin"))
        with TestClient(create_app(ctx), raise_server_exceptions=False) as client:
            dataset = new_dataset(client, admin, name="weeks", label_kind="integer", min=1, max=52,
                                  epsilon_total=1000)
            assert upload(client, admin, dataset, _csv(1000)).status_code == 200
            with _filled(mount):
                for charged in range(200):
                    response = release(client, admin, dataset, f"k{charged}", mechanism="rr", epsilon=1)
                    if response.status_code != 201:
                        break
                expect_error(response, 507, "insufficient_storage")
            assert state(client, admin, dataset)["epsilon_spent"] == charged  # the refused one charged nothing
            assert len(client.get(f"/v1/datasets/{dataset}/releases", headers=admin).json()) == charged
            again = release(client, admin, dataset, f"k{charged}", mechanism="rr", epsilon=1)  # space again
            assert again.status_code == 201, again.text
            assert state(client, admin, dataset)["epsilon_spent"] == charged + 1
    finally:
        with admin_engine.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            connection.execute(text(f"DROP TABLESPACE IF EXISTS {name}"))
        admin_engine.dispose()
        subprocess.run(["umount", "-l", str(mount)], check=False)
        mount.rmdir()
