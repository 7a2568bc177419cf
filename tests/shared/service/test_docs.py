"""The documentation pages of both services load nothing from another host: /docs and /redoc reference only
relative URLs, the assets they name are served from the package, publicly like the pages, with no listing and no
way out of their directory."""

from __future__ import annotations

import re
import socket

import pytest
from fastapi.testclient import TestClient

from labeldp.local_services import serve_in_thread
from shared.service.docs import ASSETS
from tests.shared.service.docs_apps import SERVICES, service_app

pytestmark = pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient`")

PAGES = ("/docs", "/redoc")
MEDIA = {".js": "javascript", ".css": "text/css", ".png": "image/png"}


@pytest.fixture(params=sorted(SERVICES))
def client(request, tmp_path):
    with TestClient(service_app(request.param, tmp_path)) as client:
        yield client


def _urls(html: str) -> list[str]:
    """Every URL an attribute or the page's script names (src, href, url: '…', spec-url)."""
    return re.findall(r"""(?:src|href|spec-url)=["']([^"']+)["']|\burl: ?["']([^"']+)["']""", html)


def test_pages_reference_no_other_host(client):
    for page in PAGES:
        r = client.get(page)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        assert not re.search(r"https?:|//[a-z]", r.text, re.IGNORECASE), page  # no absolute or scheme-relative URL
        urls = [a or b for a, b in _urls(r.text)]
        assert "/openapi.json" in urls, (page, urls)
        assert [u for u in urls if u != "/openapi.json" and not u.startswith(f"{ASSETS}/")] == [], urls
        for url in urls:
            asset = client.get(url)
            assert asset.status_code == 200, url
            assert len(asset.content) > 1000, url  # the bundles themselves, not a stub
            if url.startswith(ASSETS):
                media = MEDIA[url[url.rindex("."):]]
                assert media in asset.headers["content-type"], (url, asset.headers["content-type"])
    assert "fonts.googleapis" not in client.get("/redoc").text


def test_pages_may_load_from_their_own_origin_only(client):
    """Whatever a bundle hard-codes (ReDoc's logo on its vendor's CDN), the browser may not fetch it: each page's
    policy names no other host."""
    allowed = {"'self'", "'none'", "data:", "blob:"}
    for page in (*PAGES, "/docs/oauth2-redirect"):
        policy = {name: sources for name, *sources in
                  (directive.split() for directive in client.get(page).headers["content-security-policy"].split(";"))}
        assert policy["default-src"] == ["'self'"] and policy["base-uri"] == ["'none'"], (page, policy)
        assert set(policy["style-src"]) == {"'self'", "'unsafe-inline'"}  # ReDoc writes its styles in the page
        for name, sources in policy.items():
            other = [s for s in sources if s not in allowed and not (name == "script-src" and s.startswith("'sha256-"))
                     and not (name == "style-src" and s == "'unsafe-inline'")]
            assert other == [], (page, name, other)
        assert len(policy["script-src"]) == (1 if page == "/redoc" else 2), policy  # 'self' and its one inline script


def test_pages_and_assets_are_public_as_before(client):
    """Like /openapi.json, the pages (and so their assets) need no key, and a bad key changes nothing; they stay out
    of the OpenAPI."""
    urls = [*PAGES, "/docs/oauth2-redirect", f"{ASSETS}/swagger-ui-bundle.js", f"{ASSETS}/redoc.standalone.js"]
    for url in urls:
        plain = client.get(url)
        assert plain.status_code == 200, url
        assert client.get(url, headers={"Authorization": "Bearer ldp_nonsense"}).content == plain.content
    paths = client.get("/openapi.json").json()["paths"]
    assert not [p for p in paths if p.startswith(("/docs", "/redoc", ASSETS))]
    assert client.get("/v1/datasets" if "/v1/datasets" in paths else "/v1/jobs").status_code == 401


def test_no_listing_and_no_unknown_asset(client):
    for url in (ASSETS, f"{ASSETS}/", f"{ASSETS}/nothing.js", f"{ASSETS}/static/"):
        r = client.get(url)
        assert r.status_code == 404, url
        assert r.json()["error"]["code"] == "not_found", url  # the API's envelope, as for any unknown path


def _raw_get(base: str, target: str) -> tuple[int, bytes]:
    """GET ``target`` exactly as written (an HTTP client would resolve the dot segments before sending)."""
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.sendall(f"GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


@pytest.mark.parametrize("kind", sorted(SERVICES))
def test_no_path_leaves_the_assets_directory(kind, tmp_path):
    # The assets directory is fastapi_offline/static: its parent holds the package's __init__.py and core.py.
    with serve_in_thread(service_app(kind, tmp_path)) as base:
        assert _raw_get(base, f"{ASSETS}/favicon.png")[0] == 200  # the raw request itself works
        for target in (f"{ASSETS}/../__init__.py", f"{ASSETS}/../core.py", f"{ASSETS}/%2e%2e/core.py",
                       f"{ASSETS}/..%2fcore.py", f"{ASSETS}/%2E%2E%2Fcore.py", f"{ASSETS}/../../fastapi/__init__.py",
                       f"{ASSETS}//etc/passwd", f"{ASSETS}/../../../../../../../../etc/passwd"):
            status, body = _raw_get(base, target)
            assert status == 404, (target, status)
            assert b"import" not in body and b"root:" not in body, target


@pytest.mark.parametrize("kind", sorted(SERVICES))
def test_behind_a_proxy_prefix_every_url_keeps_it(kind, tmp_path):
    with TestClient(service_app(kind, tmp_path), root_path="/labeldp") as client:
        for page in PAGES:
            urls = [a or b for a, b in _urls(client.get(page).text)]
            assert urls and all(u.startswith(("/labeldp/docs-assets/", "/labeldp/openapi.json")) for u in urls), urls
