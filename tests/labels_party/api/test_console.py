"""The owner's console (labels_party/http/console) over HTTP: sign-in with an admin key only, a session cookie that is
HttpOnly, SameSite=Strict and not the key, the API's 404 for another organization's objects, the API's budget
numbers on the pages, the audit verification (and a tampered ledger caught), CSRF refused, the security headers,
no URL elsewhere, and HTML 4xx pages for bad input."""

from __future__ import annotations

import hashlib
import logging
import re
import secrets
import warnings
from datetime import timedelta

import pytest
from sqlalchemy import select, update

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from labels_party.http.auth import create_key
from labels_party.http.console import sessions
from labels_party.store import db
from shared.service.keys import hash_key
from tests.labels_party.api.helpers import (
    MISSING_DATASET,
    budget,
    created,
    labels_csv,
    new_dataset,
    release,
    upload,
)
from tests.labels_party.api.test_audit import _tamper

pytestmark = pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient`")

ORIGIN = {"Origin": "http://testserver"}
CSRF = re.compile(r'name="csrf" value="([0-9a-f]{64})"')
BUDGET = re.compile(r'data-budget="(epsilon_\w+)">([^<]*)<')


def sign_in(client, key: str, headers=ORIGIN):
    return client.post("/console/sign-in", data={"api_key": key}, headers=headers, follow_redirects=False)


def signed_in(app, key: str) -> TestClient:
    """A new browser-like client of ``app`` with a console session for ``key``."""
    browser = TestClient(app, raise_server_exceptions=False)
    r = sign_in(browser, key)
    assert r.status_code == 303 and r.headers["location"] == "/console/datasets", r.text
    return browser


def csrf_of(browser, path="/console/datasets") -> str:
    return CSRF.search(browser.get(path).text).group(1)


def page(browser, path: str, status: int = 200) -> str:
    r = browser.get(path, follow_redirects=False)
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("text/html")
    assert "Traceback" not in r.text
    return r.text


def budget_on(html: str) -> dict:
    return {name: float(value) for name, value in BUDGET.findall(html)}


def test_sign_in_with_an_admin_key_sets_a_session_cookie_that_is_not_the_key(ctx, client, keys, dataset):
    r = client.get("/console/datasets", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/console/sign-in"
    assert "api_key" in page(client, "/console/sign-in")

    r = sign_in(client, keys["admin"])
    assert r.status_code == 303 and r.headers["location"] == "/console/datasets"
    cookie = r.headers["set-cookie"]
    attributes = [a.strip() for a in cookie.split(";")]
    name, token = attributes[0].split("=", 1)
    assert name == "labeldp_console" and len(token) >= 43
    assert {"HttpOnly", "SameSite=Strict", "Path=/console"} <= set(attributes)
    assert "Secure" not in attributes  # plain HTTP here; see the https test
    assert int(dict(a.split("=", 1) for a in attributes if "=" in a)["Max-Age"]) > 0
    key = keys["admin"]
    _, prefix, secret = key.split("_", 2)  # the secret may itself hold "_"
    assert key not in cookie and secret not in cookie and prefix not in cookie
    # Only the token's digest keyed by the audit key is stored (not its plain SHA-256), tied to the admin's key.
    with ctx.sessions() as s, s.begin():
        rows = list(s.scalars(select(db.ConsoleSession)))
        assert [row.token_hash for row in rows] == [ctx.ledger.signer.digest("console session", token)]
        assert rows[0].token_hash != hashlib.sha256(token.encode()).hexdigest()
        assert s.get(db.ApiKey, rows[0].api_key_id).role == "admin"
        assert rows[0].expires_at > db.utcnow()

    html = page(client, "/console/datasets")
    assert "weeks" in html and "hospital" in html and key not in html
    assert f'href="/console/datasets/{dataset}"' in html

    # Signing in again from the same browser replaces its session: a new token, the old one gone.
    again = sign_in(client, key).headers["set-cookie"].split(";")[0].split("=", 1)[1]
    assert again != token
    with ctx.sessions() as s, s.begin():
        assert [row.token_hash for row in s.scalars(select(db.ConsoleSession))] == [
            ctx.ledger.signer.digest("console session", again)]


def test_the_cookie_is_secure_over_https(client, keys):
    browser = TestClient(client.app, base_url="https://testserver")
    r = sign_in(browser, keys["admin"], headers={"Origin": "https://testserver"})
    assert r.status_code == 303
    assert "Secure" in [a.strip() for a in r.headers["set-cookie"].split(";")]


@pytest.mark.parametrize("who, status", [("consumer", 403), ("stranger", 403), ("wrong", 401), ("empty", 401),
                                         ("garbage", 401)])
def test_consumer_and_wrong_keys_are_refused(ctx, client, keys, dataset, who, status, caplog):
    invalid = {"wrong": "ldp_00000000_" + "x" * 43, "empty": "", "garbage": "<b>not a key</b> ' \" é"}
    key = invalid[who] if who in invalid else keys[who]
    with caplog.at_level(logging.DEBUG):
        r = sign_in(client, key)
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("text/html") and "set-cookie" not in r.headers
    assert 'id="sign-in-error"' in r.text
    if key:
        assert key not in r.text and key not in caplog.text  # the key is never echoed or logged
    assert "<b>not a key</b>" not in r.text
    with ctx.sessions() as s, s.begin():
        assert s.scalar(select(db.ConsoleSession)) is None
    assert client.get("/console/datasets", follow_redirects=False).status_code == 303


def test_the_key_is_not_stored_logged_or_shown(client, keys, dataset, db_url, caplog):
    key = keys["admin"]
    with caplog.at_level(logging.DEBUG):
        browser = signed_in(client.app, key)
        pages = [page(browser, "/console/datasets"), page(browser, f"/console/datasets/{dataset}")]
    assert all(key not in html for html in pages)
    assert key not in caplog.text
    database = db_url.removeprefix("sqlite:///")
    stored = b"".join(open(path, "rb").read() for path in (database, database + "-wal") if _exists(path))
    assert key.encode() not in stored


def _exists(path: str) -> bool:
    import os

    return os.path.exists(path)


def test_another_organizations_objects_are_404_as_in_the_api(client, admin, keys, consumer, dataset):
    rel = created(release(client, consumer, dataset, "a", mechanism="laplace", epsilon=1))
    other = signed_in(client.app, keys["other_admin"])
    csrf = csrf_of(other)
    assert "weeks" not in page(other, "/console/datasets")
    for path in (f"/console/datasets/{dataset}", f"/console/releases/{rel['id']}"):
        existing, missing = page(other, path, 404), page(other, path.replace(path.rsplit("/", 1)[1],
                                                                             MISSING_DATASET), 404)
        assert existing == missing  # the same answer whether it exists or not
    r = other.post(f"/console/datasets/{dataset}/verify", data={"csrf": csrf}, headers=ORIGIN)
    assert r.status_code == 404 and r.headers["content-type"].startswith("text/html")
    # ... while the owner sees both
    owner = signed_in(client.app, keys["admin"])
    assert "weeks" in page(owner, f"/console/datasets/{dataset}")
    assert "laplace" in page(owner, f"/console/releases/{rel['id']}")


def test_budget_numbers_are_the_apis(client, admin, keys, consumer, dataset, dataset_small):
    # the owner keeps 0.5 of every example's budget for itself (the fixture granted the publisher all 3)
    assert client.post(f"/v1/datasets/{dataset}/grants", json={"org": "publisher", "epsilon": 2.5},
                       headers=admin).status_code == 201
    created(release(client, consumer, dataset, "a", mechanism="laplace", epsilon=1))
    created(release(client, consumer, dataset, "b", mechanism="rr", epsilon=0.5, example_ids=["e1", "e2"]))
    created(release(client, admin, dataset, "c", mechanism="rr", epsilon=0.1, example_ids=["e3"]))
    api = budget(client, admin, dataset)
    # the dataset's spent ε sums the organizations' largest per-example use (1.5 + 0.1): an upper bound
    assert (api["epsilon_spent"], api["epsilon_remaining"]) == (1.6, 1.4)
    browser = signed_in(client.app, keys["admin"])

    html = page(browser, f"/console/datasets/{dataset}")
    assert budget_on(html) == {k: api[k] for k in ("epsilon_total", "epsilon_spent", "epsilon_remaining")}
    # per-example spent over every organization: 2 examples at 1.5, 1 at 1.1, the rest at 1.0; the largest is
    # exact, within the API's upper bound
    assert re.search(r'data-examples="total">(\d+)<', html).group(1) == "2000"
    assert re.search(r'data-examples="never">(\d+)<', html).group(1) == "0"
    assert float(re.search(r'data-examples="most">([^<]+)<', html).group(1)) == 1.5 < api["epsilon_spent"]
    usage = re.findall(r"<tr><td>(\w+)</td><td>([\w-]+)</td><td>(\d+)</td><td>([\d.]+)</td><td>(\d+)</td></tr>",
                       html)
    assert usage == [("hospital", "rr", "1", "0.1", "1"), ("publisher", "laplace", "1", "1.0", "2000"),
                     ("publisher", "rr", "1", "0.5", "2")]

    overview = page(browser, "/console/datasets")
    cards = dict(re.findall(r'<section class="card" id="dataset-(\w+)">(.*?)</section>', overview, re.S))
    assert set(cards) == {dataset, dataset_small}
    for dataset_id, card in cards.items():
        api = budget(client, admin, dataset_id)
        assert budget_on(card) == {k: api[k] for k in ("epsilon_total", "epsilon_spent", "epsilon_remaining")}
    assert re.search(r"<td>publisher</td><td>granted</td><td>2</td>\s*<td>1.5</td>", cards[dataset])
    assert re.search(r"<td>hospital</td><td>owner</td><td>1</td>\s*<td>0.1</td>", cards[dataset])


def test_verify_reports_a_tampered_audit(ctx, client, keys, consumer, dataset):
    created(release(client, consumer, dataset, "a", mechanism="laplace", epsilon=1))
    browser = signed_in(client.app, keys["admin"])
    html = page(browser, f"/console/datasets/{dataset}")
    assert re.search(r'id="chain-status"[^>]*>valid<', html)
    csrf = CSRF.search(html).group(1)

    r = browser.post(f"/console/datasets/{dataset}/verify", data={"csrf": csrf}, headers=ORIGIN)
    assert r.status_code == 200 and 'id="verify-result" class="ok">VALID' in r.text

    _tamper(ctx)
    r = browser.post(f"/console/datasets/{dataset}/verify", data={"csrf": csrf}, headers=ORIGIN)
    assert r.status_code == 200 and 'id="verify-result" class="bad">BROKEN' in r.text
    assert "<li>hash chain broken</li>" in r.text
    assert re.search(r'id="chain-status"[^>]*>BROKEN<', page(browser, f"/console/datasets/{dataset}"))


def test_cross_site_posts_are_refused(ctx, client, keys, dataset):
    browser = signed_in(client.app, keys["admin"])
    csrf = csrf_of(browser)
    verify = f"/console/datasets/{dataset}/verify"
    refusals = [
        browser.post(verify, data={"csrf": csrf}, headers={"Origin": "https://evil.example"}),  # right token
        browser.post(verify, data={"csrf": csrf}, headers={"Origin": "null"}),
        browser.post(verify, data={"csrf": csrf}, headers={"Referer": "https://evil.example/console/x"}),
        browser.post(verify, data={"csrf": csrf}),  # neither Origin nor Referer
        browser.post(verify, data={"x": "1"}, headers=ORIGIN),  # same origin, no token
        browser.post(verify, data={"csrf": "0" * 64}, headers=ORIGIN),
        browser.post("/console/sign-out", data={"x": "1"}, headers=ORIGIN),
        browser.post("/console/sign-out", data={"csrf": csrf}, headers={"Origin": "https://evil.example"}),
        sign_in(browser, keys["admin"], headers={"Origin": "https://evil.example"}),  # login CSRF
    ]
    for r in refusals:
        assert r.status_code == 403, r.text
        assert r.headers["content-type"].startswith("text/html") and "set-cookie" not in r.headers
    with ctx.sessions() as s, s.begin():
        assert len(list(s.scalars(select(db.ConsoleSession)))) == 1  # still signed in, no second session
    ok = browser.post(verify, data={"csrf": csrf}, headers={"Referer": f"http://testserver/console/datasets/{dataset}"})
    assert ok.status_code == 200

    # Signing out (same origin, with the token) deletes the session and clears the cookie.
    r = browser.post("/console/sign-out", data={"csrf": csrf}, headers=ORIGIN, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/console/sign-in"
    assert "Max-Age=0" in r.headers["set-cookie"]
    with ctx.sessions() as s, s.begin():
        assert s.scalar(select(db.ConsoleSession)) is None
    assert browser.get("/console/datasets", follow_redirects=False).status_code == 303
    r = browser.post(verify, data={"csrf": csrf}, headers=ORIGIN)
    assert r.status_code == 401 and r.headers["content-type"].startswith("text/html")


def test_a_stolen_session_token_is_not_enough_without_the_cookie_flags(client, keys, dataset):
    """The CSRF token is derived from the session token and differs between sessions."""
    one, two = signed_in(client.app, keys["admin"]), signed_in(client.app, keys["admin"])
    assert csrf_of(one) != csrf_of(two)
    r = one.post(f"/console/datasets/{dataset}/verify", data={"csrf": csrf_of(two)}, headers=ORIGIN)
    assert r.status_code == 403


def test_a_session_row_a_database_writer_inserts_opens_nothing(ctx, client, keys, dataset):
    """Issue 40's review: a row with the SHA-256 of the writer's own token, on the owner's certified admin key,
    served the owner's console. The stored digest is keyed by the audit key: the writer cannot make one."""
    with ctx.sessions() as s, s.begin():
        admin_key = s.scalar(select(db.ApiKey).where(db.ApiKey.key_hash == hash_key(keys["admin"])))
        token = f"{admin_key.id}.{secrets.token_urlsafe(32)}"
        s.add(db.ConsoleSession(token_hash=hashlib.sha256(token.encode()).hexdigest(), api_key_id=admin_key.id,
                                created_at=db.utcnow(), expires_at=db.utcnow() + timedelta(hours=1)))
    browser = TestClient(client.app)
    browser.cookies.set("labeldp_console", token, path="/console")
    r = browser.get(f"/console/datasets/{dataset}", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"].endswith("/console/sign-in"), r.text[:300]
    assert page(signed_in(client.app, keys["admin"]), f"/console/datasets/{dataset}")  # a real session works


def test_a_session_row_pointed_at_another_owners_key_opens_nothing(ctx, client, keys, dataset):
    """Issue 40's sixth review: a writer signed in with their own admin key, then pointed their session's row at the
    owner's admin key; the cookie served the owner's console. The token names its key and the digest covers it."""
    browser = signed_in(client.app, keys["other_admin"])
    assert browser.get(f"/console/datasets/{dataset}", follow_redirects=False).status_code == 404
    with ctx.sessions() as s, s.begin():
        owner = s.scalar(select(db.ApiKey.id).where(db.ApiKey.key_hash == hash_key(keys["admin"])))
        assert s.execute(update(db.ConsoleSession).values(api_key_id=owner)).rowcount == 1
    r = browser.get(f"/console/datasets/{dataset}", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"].endswith("/console/sign-in"), r.text[:300]
    assert "weeks" not in browser.get("/console/datasets").text


def test_expired_sessions_and_revoked_keys_end_the_session(ctx, client, keys, dataset):
    browser = signed_in(client.app, keys["admin"])
    assert page(browser, "/console/datasets")
    with ctx.sessions() as s, s.begin():
        s.execute(update(db.ConsoleSession).values(expires_at=db.utcnow().replace(year=2000)))
    assert browser.get("/console/datasets", follow_redirects=False).status_code == 303

    browser = signed_in(client.app, keys["admin"])
    with ctx.sessions() as s, s.begin():
        assert len(list(s.scalars(select(db.ConsoleSession)))) == 1  # the expired one was swept
        s.execute(update(db.ApiKey).where(db.ApiKey.role == "admin").values(revoked_at=db.utcnow()))
    assert browser.get(f"/console/datasets/{dataset}", follow_redirects=False).status_code == 303
    assert sign_in(client, keys["admin"]).status_code == 401

    # a key that expires ends its sessions the same way
    with ctx.sessions() as s, s.begin():
        expiring = create_key(ctx.ledger, s, "hospital", "admin", expires_at=db.utcnow() + timedelta(hours=1))
    browser = signed_in(client.app, expiring)
    assert page(browser, f"/console/datasets/{dataset}")
    with ctx.sessions() as s, s.begin():
        s.execute(update(db.ApiKey).where(db.ApiKey.key_hash == hash_key(expiring))
                  .values(expires_at=db.utcnow() - timedelta(seconds=1)))
    assert browser.get(f"/console/datasets/{dataset}", follow_redirects=False).status_code == 303
    assert sign_in(client, expiring).status_code == 401


def test_security_headers_and_no_external_urls_on_every_page(client, admin, keys, consumer, dataset):
    rel = created(release(client, consumer, dataset, "a", mechanism="opt-unbiased", epsilon=2))
    created(release(client, consumer, dataset, "b", mechanism="laplace", epsilon=0.5))
    browser = signed_in(client.app, keys["admin"])
    csrf = csrf_of(browser)
    responses = [browser.get(path) for path in (
        "/console/sign-in", "/console/datasets", f"/console/datasets/{dataset}", f"/console/releases/{rel['id']}",
        "/console/static/console.css", "/console/nope", f"/console/datasets/{MISSING_DATASET}")]
    responses += [browser.post(f"/console/datasets/{dataset}/verify", data={"csrf": csrf}, headers=ORIGIN),
                  browser.post(f"/console/datasets/{dataset}/verify", data={"csrf": csrf}),
                  client.get("/console/datasets", follow_redirects=False)]
    for r in responses:
        csp = r.headers["content-security-policy"]
        directives = dict(d.strip().split(" ", 1) for d in csp.split(";"))
        assert directives["default-src"] == "'none'" and directives["frame-ancestors"] == "'none'"
        assert directives["style-src"] == "'self'" and "script-src" not in directives  # no script at all
        assert "unsafe" not in csp and "http" not in csp
        assert r.headers["x-frame-options"] == "DENY" and r.headers["x-content-type-options"] == "nosniff"
        if r.headers.get("content-type", "").startswith("text/html"):
            html = r.text
            assert "<script" not in html.lower() and " style=" not in html and "<iframe" not in html
            without_namespaces = html.replace('xmlns="http://www.w3.org/2000/svg"', "")
            assert "http:" not in without_namespaces and "https:" not in without_namespaces
            assert "//" not in "".join(re.findall(r'(?:href|src|action)="([^"]*)"', html))
            for url in re.findall(r'(?:href|src|action)="([^"]*)"', html):
                assert url.startswith("/console/"), url


def test_a_release_page_shows_the_mechanism_and_stays_bounded_for_wide_randomizers(client, admin, keys):
    wide = new_dataset(client, admin, name="prices", label_kind="integer", min=0, max=9999, epsilon_total=10)
    assert upload(client, admin, wide, "example_id,label\n" + "".join(f"p{i},{i * 37 % 10000}\n"
                                                                        for i in range(3000))).status_code == 200
    rel = created(release(client, admin, wide, "rr", mechanism="rr", epsilon=1))
    bins = created(release(client, admin, wide, "bins", mechanism="rr-on-bins", epsilon=1))
    browser = signed_in(client.app, keys["admin"])
    for r in (rel, bins):
        html = page(browser, f"/console/releases/{r['id']}")
        assert len(html) < 250_000
        heatmap = re.search(r'<svg[^>]*aria-label="randomizer heatmap".*?</svg>', html, re.S).group(0)
        assert 1 <= heatmap.count("<rect") <= 48 * 48
        assert "downsampled to 48 ×" in html and "rows are true labels (10000)" in html
    assert f"Output values ({10000})" in page(browser, f"/console/releases/{rel['id']}")


def test_a_group_release_page_shows_its_first_groups_randomizers(client, admin, keys):
    """A group release is described in columns (each distinct randomizer once, the grid once): the page shows how
    many groups there are and a heatmap for each of the first few, their matrices rebuilt on the shared grid."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    classes = new_dataset(client, admin, name="segments", label_kind="classes", num_classes=4, epsilon_total=10)
    ids = [f"g{i}" for i in range(40)]
    assert upload(client, admin, classes, labels_csv({e: i % 4 for i, e in enumerate(ids)})).status_code == 200
    sink = io.BytesIO()
    pq.write_table(pa.table({"example_id": ids, "group": [f"s{i % 5}" for i in range(40)]}), sink)
    r = client.post(f"/v1/datasets/{classes}/group-releases", content=sink.getvalue(),
                    params={"mechanism": "rr-with-prior", "epsilon": 2, "prior_epsilon": 1},
                    headers={**admin, "Content-Type": "application/vnd.apache.parquet", "Idempotency-Key": "g"})
    html = page(signed_in(client.app, keys["admin"]), f"/console/releases/{created(r)['id']}")
    assert "5 groups, each with its own prior and randomizer; the first 3 are shown" in html
    assert html.count('aria-label="randomizer heatmap"') == 3
    for name in ("s0", "s1", "s2"):
        assert f"group {name} (8 examples)" in html


def test_additive_and_evaluation_releases_have_no_matrix(client, admin, consumer, keys, dataset):
    rel = created(release(client, consumer, dataset, "lap", mechanism="staircase", epsilon=1))
    browser = signed_in(client.app, keys["admin"])
    html = page(browser, f"/console/releases/{rel['id']}")
    assert "Additive noise" in html and "discrete-staircase" in html and "randomizer heatmap" not in html


def test_names_are_escaped(client, admin, keys):
    new_dataset(client, admin, name='<script>alert("x")</script>', label_kind="integer", min=0, max=3,
                epsilon_total=1)
    html = page(signed_in(client.app, keys["admin"]), "/console/datasets")
    assert "<script" not in html and "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in html


def test_bad_input_gets_an_html_4xx_page(client, keys, dataset):
    browser = signed_in(client.app, keys["admin"])
    csrf = csrf_of(browser)
    verify = f"/console/datasets/{dataset}/verify"
    cases = [
        (browser.get("/console/nope"), 404),
        (browser.get("/console/static/secret.txt"), 404),
        (browser.get("/console/sign-out"), 405),
        (browser.put(verify, content=b"x", headers=ORIGIN), 405),
        (browser.post(verify, content=f"csrf={csrf}", headers={**ORIGIN, "Content-Type": "text/plain"}), 415),
        (browser.post(verify, content=b"csrf=\xff\xfe", headers={**ORIGIN, "Content-Type": sessions_form()}), 400),
        (browser.post(verify, content=b"csrf=%ff%fe", headers={**ORIGIN, "Content-Type": sessions_form()}), 400),
        (browser.post(verify, content="&".join(f"f{i}=1" for i in range(20)),
                      headers={**ORIGIN, "Content-Type": sessions_form()}), 400),
        (browser.post(verify, content=b"csrf=" + b"a" * 10_000, headers={**ORIGIN, "Content-Type": sessions_form()}),
         413),
        (sign_in(client, "k" * 5000), 413),
        (client.post("/console/sign-in", content=_chunks(5000), headers={**ORIGIN, "Content-Type": sessions_form()}),
         413),
    ]
    for r, status in cases:
        assert r.status_code == status, (status, r.text)
        assert r.headers["content-type"].startswith("text/html")
        assert "Traceback" not in r.text and f'data-status="{status}"' in r.text
    assert cases[3][0].headers["allow"] == "POST"


def sessions_form() -> str:
    return "application/x-www-form-urlencoded"


def _chunks(size: int):
    """A body without a declared length (chunked), so only the streaming limit can stop it."""
    yield b"api_key="
    for _ in range(size // 100):
        yield b"k" * 100


def test_the_api_is_unchanged_by_a_console_session(client, keys, dataset):
    """A console cookie is no API credential: the API still wants a bearer key."""
    browser = signed_in(client.app, keys["admin"])
    assert sessions.COOKIE in {cookie.name for cookie in browser.cookies.jar}
    r = browser.get(f"/v1/datasets/{dataset}/budget")  # the cookie is for /console only, and no key here
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
    assert "/console/datasets" not in client.get("/openapi.json").text
