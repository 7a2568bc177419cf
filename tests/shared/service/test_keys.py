"""API keys on both services (:mod:`shared.service.keys`, the key commands of :mod:`shared.service.commands`):
expiry, revocation that records who and when, rotation with an optional grace period, listing without secrets.
A revoked or expired key gets the very 401 an unknown key gets, on every route of both services and in a console
session it opened; a revocation made by another process (the CLI) refuses the next request of a running server.

Runtime: about 35 s on SQLite (the two ``serve`` processes take 14 s each), as much again on PostgreSQL — on an
idle machine; up to 2.5x that under load."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import warnings
from datetime import timedelta

import httpx
import pytest
from sqlalchemy import update

with warnings.catch_warnings():  # starlette: "Using `httpx` with `starlette.testclient` is deprecated"
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from features_party import db as trainer_db
from features_party.api import create_app as create_trainer
from features_party.auth import KEYS as TRAINER_KEYS
from features_party.process import make_context as make_trainer_context
from features_party.settings import TrainerSettings
from labeldp.cli import main
from labeldp.local_services import free_port, serve_process
from labels_party.http.api import create_app as create_labels
from labels_party.http.auth import key_ring
from labels_party.runtime.context import make_context
from labels_party.store import db as labels_db
from shared.errors import LabelDPError
from shared.service.database import utcnow
from shared.service.keys import UNAUTHORIZED_MESSAGE, KeyRef, expiry

pytestmark = pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient`")

UNAUTHORIZED = {"error": {"code": "unauthorized", "message": UNAUTHORIZED_MESSAGE}}


def _labels(database_url, tmp_path):
    ctx = make_context(database_url, tmp_path / "data")
    return ctx.sessions, key_ring(ctx.ledger), create_labels(ctx), labels_db.ApiKey  # certified, as the CLI's


def _trainer(database_url, tmp_path):
    ctx = make_trainer_context(TrainerSettings(database_url=database_url, data_dir=tmp_path / "trainer"))
    return ctx.sessions, TRAINER_KEYS, create_trainer(ctx), trainer_db.ApiKey


SERVICES = {"labels": (_labels, "admin", "ldp"), "features": (_trainer, "member", "trn")}


def _v1_requests(app) -> list[tuple[str, str]]:
    """(method, path) of every route under /v1 the OpenAPI lists, path parameters filled with a name that exists
    nowhere."""
    return [(method.upper(), re.sub(r"\{[^}]+\}", "x", path))
            for path, operations in app.openapi()["paths"].items() if path.startswith("/v1")
            for method in operations if method in ("get", "put", "post", "delete", "patch")]


@pytest.mark.parametrize("party", SERVICES)
def test_revoked_and_expired_keys_get_an_unknown_keys_401_on_every_route(database_url, tmp_path, party):
    build, role, kind = SERVICES[party]
    sessions, keys, app, api_key = build(database_url, tmp_path)
    with sessions() as session, session.begin():
        revoked = keys.issue(session, "owner", role)
        expiring = keys.issue(session, "owner", role, expires_at=utcnow() + timedelta(hours=1))
    client = TestClient(app, raise_server_exceptions=False)

    def get(key: str) -> httpx.Response:
        return client.get("/v1/datasets" if party == "labels" else "/v1/jobs",
                          headers={"Authorization": f"Bearer {key}"})

    assert get(revoked.secret).status_code == get(expiring.secret).status_code == 200  # both in force
    with sessions() as session, session.begin():
        keys.revoke(session, KeyRef(id=revoked.info.id), by="test")
        session.execute(update(api_key).where(api_key.id == expiring.info.id)
                        .values(expires_at=utcnow() - timedelta(seconds=1)))  # its hour has passed
    unknown = f"{kind}_00000000_{'x' * 43}"
    requests = _v1_requests(app)
    assert len(requests) >= (16 if party == "labels" else 9)  # the scan sees the routes
    for method, path in requests:
        for key in (unknown, revoked.secret, expiring.secret):
            r = client.request(method, path, headers={"Authorization": f"Bearer {key}"}, content=b"{}")
            assert (r.status_code, r.json(), r.headers["WWW-Authenticate"]) == (401, UNAUTHORIZED, "Bearer"), \
                (method, path)


@pytest.mark.parametrize("party", SERVICES)
def test_key_commands(database_url, tmp_path, party, capsys):
    """create-key with an expiry, list-keys without secrets, revoke-key (who and when), rotate-key with a grace
    period; errors are one line on stderr and exit 2; --json prints one document."""
    build, role, kind = SERVICES[party]
    sessions, keys, app, _ = build(database_url, tmp_path)
    storage = ["--database-url", database_url,
               "--data-dir", str(tmp_path / ("data" if party == "labels" else "trainer"))]
    client = TestClient(app, raise_server_exceptions=False)
    route = "/v1/datasets" if party == "labels" else "/v1/jobs"

    def run(*args: str) -> tuple[int, str, str]:
        code = main([party, *args, *storage])
        out, err = capsys.readouterr()
        return code, out, err

    def status(key: str) -> int:
        return client.get(route, headers={"Authorization": f"Bearer {key}"}).status_code

    code, out, err = run("create-key", "--org", "owner", "--role", role)
    assert code == 0 and err == "" and out.count("\n") == 1 and out.startswith(f"{kind}_")
    plain = out.strip()
    code, out, err = run("create-key", "--org", "owner", "--role", role, "--expires-in", "30", "--json")
    created = json.loads(out)
    assert code == 0 and err == ""
    lifetime = _time(created["expires_at"]) - _time(created["created_at"])
    assert abs(lifetime - timedelta(days=30)) < timedelta(seconds=30)  # from the command's start
    assert created["key"].split("_")[1] == created["prefix"] and created["status"] == "active"
    assert status(plain) == status(created["key"]) == 200
    code, out, _ = run("create-key", "--org", "other", "--role", role, "--expires-at", "2999-01-02", "--json")
    assert json.loads(out)["expires_at"] == "2999-01-02T00:00:00+00:00"  # a date is midnight UTC

    code, out, err = run("list-keys", "--json")
    listed = json.loads(out)["keys"]
    assert code == 0 and [(k["id"], k["organization"], k["role"], k["status"]) for k in listed] == [
        (1, "owner", role, "active"), (2, "owner", role, "active"), (3, "other", role, "active")]
    assert set(listed[0]) == {"id", "prefix", "organization", "role", "created_at", "expires_at", "revoked_at",
                              "revoked_by", "status"}
    assert plain.split("_", 2)[2] not in out and created["key"] not in out  # never a secret (nor a hash: no field)
    assert len(json.loads(run("list-keys", "--org", "other", "--json")[1])["keys"]) == 1

    # revocation: now, who and when; the key is refused at once; a second revocation is an error that says so
    code, out, err = run("revoke-key", "--prefix", f"{kind}_{created['prefix']}", "--by", "alice", "--json")
    revoked = json.loads(out)
    assert code == 0 and err == "" and (revoked["id"], revoked["status"], revoked["revoked_by"]) == (2, "revoked",
                                                                                                       "alice")
    assert status(created["key"]) == 401 and status(plain) == 200
    code, out, err = run("revoke-key", "--id", "2")
    assert (code, out) == (2, "") and err.count("\n") == 1 and "already revoked" in err and "alice" in err

    # rotation with a grace period: both keys work until the old one's revocation takes effect (here: revoked now)
    code, out, err = run("rotate-key", "--id", "1", "--grace-hours", "2", "--by", "bob")
    new = out.strip()
    assert code == 0 and out.count("\n") == 1 and new.startswith(f"{kind}_") and new not in err
    assert status(new) == status(plain) == 200
    rows = {k["id"]: k for k in json.loads(run("list-keys", "--json")[1])["keys"]}
    assert rows[1]["status"] == "rotating" and rows[1]["revoked_by"] == "bob"
    assert timedelta(hours=2) - timedelta(minutes=1) < _time(rows[1]["revoked_at"]) - utcnow() <= timedelta(hours=2)
    assert (rows[4]["organization"], rows[4]["role"], rows[4]["expires_at"]) == ("owner", role, None)
    assert run("rotate-key", "--id", "1")[0] == 2  # a rotated key is not rotated again
    assert run("revoke-key", "--id", "1", "--by", "bob")[0] == 0  # its grace ends now
    assert status(plain) == 401 and status(new) == 200

    # a rotation without grace keeps the old key's lifetime; its JSON is one document with both keys' records
    code, out, _ = run("create-key", "--org", "owner", "--role", role, "--expires-in", "10", "--json")
    short = json.loads(out)
    code, out, err = run("rotate-key", "--prefix", short["prefix"], "--json")
    rotated = json.loads(out)
    assert code == 0 and rotated["replaced"]["status"] == "revoked" and rotated["replaced"]["id"] == short["id"]
    assert abs(_time(rotated["expires_at"]) - _time(rotated["created_at"]) - timedelta(days=10)) < \
        timedelta(seconds=30)
    assert status(short["key"]) == 401 and status(rotated["key"]) == 200

    # refusals: one line on stderr, exit 2, nothing on stdout
    for args, words in [(("revoke-key", "--id", "99"), "no key with id 99"),
                        (("revoke-key", "--prefix", "zz"), "8 hexadecimal digits"),
                        (("revoke-key",), "--id --prefix is required"),
                        (("revoke-key", "--id", "3", "--prefix", "00000000"), "not allowed with"),
                        (("create-key", "--org", "o", "--role", role, "--expires-at", "2001-01-01"), "not in the fut"),
                        (("create-key", "--org", "o", "--role", role, "--expires-in", "0"), "(0, 36500]"),
                        (("create-key", "--org", "o", "--role", role, "--expires-in", "1", "--expires-at",
                          "2999-01-01"), "not allowed with"),
                        (("rotate-key", "--id", "3", "--grace-hours", "721"), "[0, 720]"),
                        (("list-keys", "--org", "nobody"), "no organization named 'nobody'")]:
        code, out, err = run(*args)
        assert (code, out) == (2, ""), args
        assert err.count("\n") == 1 and words in err, (args, err)
    assert [k["id"] for k in json.loads(run("list-keys", "--json")[1])["keys"]] == [1, 2, 3, 4, 5, 6]  # unchanged


def _time(text: str):
    from datetime import datetime

    return datetime.fromisoformat(text)


def test_expiry_and_key_references():
    now = utcnow()
    assert expiry(now=now) is None
    assert expiry(days=1.5, now=now) == now + timedelta(hours=36)
    assert expiry(at="2999-01-01T12:00:00+02:00", now=now).isoformat() == "2999-01-01T10:00:00+00:00"
    for days in (0, -1, float("nan"), float("inf"), 36_501):
        with pytest.raises(LabelDPError, match="36500"):
            expiry(days=days, now=now)
    with pytest.raises(LabelDPError, match="ISO 8601"):
        expiry(at="next tuesday", now=now)
    assert str(KeyRef(prefix="ldp_0a1b2c3d")) == "prefix ldp_0a1b2c3d" and str(KeyRef(id=7)) == "id 7"
    for bad in (dict(), dict(id=1, prefix="0a1b2c3d"), dict(prefix="0A1B2C3D"), dict(prefix="0a1b2c3")):
        with pytest.raises(LabelDPError):
            KeyRef(**bad)


def _cli(party: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "labeldp", party, *args], capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("party", SERVICES)
def test_a_revocation_by_another_process_refuses_the_next_request_of_a_running_server(database_url, tmp_path, party):
    """A real ``serve`` process; the key is created, revoked and rotated by ``labeldp`` processes while it runs,
    and its very next request is refused — the server keeps nothing of a key's validity in memory. On the labels
    service the console session the key opened ends too. The secret appears in no server log."""
    _, role, kind = SERVICES[party]
    storage = ["--database-url", database_url, "--data-dir", str(tmp_path / "data")]
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "server.log"
    route = "/v1/datasets" if party == "labels" else "/v1/jobs"
    created = _cli(party, "create-key", "--org", "owner", "--role", "admin" if party == "labels" else role,
                   "--json", *storage)
    assert created.returncode == 0, created.stderr
    key = json.loads(created.stdout)
    unknown = f"{kind}_{key['prefix']}_{'x' * 43}"  # its public part, another secret
    with serve_process([sys.executable, "-m", "labeldp", party, "serve", "--port", str(port), *storage], base,
                       log=log), httpx.Client(base_url=base, timeout=30) as http:
        def get(secret: str) -> httpx.Response:
            return http.get(route, headers={"Authorization": f"Bearer {secret}"})

        assert get(key["key"]).status_code == 200
        if party == "labels":
            signed = http.post("/console/sign-in", data={"api_key": key["key"]}, headers={"Origin": base})
            assert signed.status_code == 303 and http.get("/console/datasets").status_code == 200
        revoked = _cli(party, "revoke-key", "--prefix", key["prefix"], "--by", "operator", *storage)
        assert revoked.returncode == 0 and revoked.stderr == "" and "revoked" in revoked.stdout
        refused, stranger = get(key["key"]), get(unknown)
        assert refused.status_code == stranger.status_code == 401
        assert refused.json() == stranger.json() == UNAUTHORIZED  # nothing says the key exists or was revoked
        if party == "labels":
            page = http.get("/console/datasets")
            assert page.status_code == 303 and page.headers["location"] == "/console/sign-in"
            again = http.post("/console/sign-in", data={"api_key": key["key"]}, headers={"Origin": base})
            assert again.status_code == 401 and "not a valid API key" in again.text

        fresh = _cli(party, "create-key", "--org", "owner", "--role", "admin" if party == "labels" else role,
                     *storage).stdout.strip()
        rotated = _cli(party, "rotate-key", "--prefix", fresh.split("_")[1], *storage)
        assert rotated.returncode == 0 and rotated.stdout.count("\n") == 1, rotated.stderr
        assert get(fresh).status_code == 401 and get(rotated.stdout.strip()).status_code == 200
    written = log.read_text()
    assert "401" in written  # the log is the server's access log
    # it says which database and data directory it opened (a password would be hidden: none here)
    shown = database_url if "@" not in database_url.split("//", 1)[-1].split("/", 1)[0] else None
    assert f"data directory {(tmp_path / 'data').resolve()}" in written
    assert shown is None or f"database {shown}," in written, written[:2000]
    assert not any(secret.split("_", 2)[2] in written for secret in (key["key"], fresh, rotated.stdout.strip()))
