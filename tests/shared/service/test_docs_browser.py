"""Both services' documentation pages in a real browser with no network but the service's own loopback address:
Debian's chromium (tests/support/browser.py) renders Swagger UI at /docs and ReDoc at /redoc of each service,
every operation of its OpenAPI is listed, "Try it out" reaches the service, and nothing was requested from another
host. Screenshots go to the
test's ``tmp_path``."""

from __future__ import annotations

from urllib.parse import urlsplit

import httpx
import pytest

from labeldp.local_services import serve_in_thread
from tests.shared.service.docs_apps import SERVICES, service_app
from tests.support.browser import chromium

METHODS = ("get", "put", "post", "delete", "patch", "head", "options", "trace")
# ReDoc's bundle hard-codes its sidebar's Redocly logo on the vendor's CDN; the page's Content-Security-Policy stops
# the browser before it asks (shared/service/docs.py), which the browser reports as this refusal and nothing else.
REDOC_LOGO = "https://cdn.redoc.ly/redoc/logo-mini.svg"


def _operations(base: str) -> dict[tuple[str, str], str]:
    """(method, path) -> operationId of every operation the service's OpenAPI declares."""
    spec = httpx.get(f"{base}/openapi.json", timeout=30).json()
    return {(method, path): operation["operationId"] for path, item in spec["paths"].items()
            for method, operation in item.items() if method in METHODS}


@pytest.mark.parametrize("kind", sorted(SERVICES))
def test_docs_render_offline_in_chromium(kind, tmp_path):
    with serve_in_thread(service_app(kind, tmp_path)) as base, chromium() as browser:
        own = urlsplit(base).netloc
        operations = _operations(base)
        assert ("get", SERVICES[kind]) in operations and len(operations) > 5
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        elsewhere, loaded, problems = [], [], []

        def only_own(route):  # the network a labels party often has: its own host, nothing else
            url = route.request.url
            if urlsplit(url).netloc == own:
                loaded.append(url)
                route.continue_()
            else:
                elsewhere.append(url)
                route.abort("internetdisconnected")

        page.route("**/*", only_own)
        page.on("console", lambda message: problems.append((page.url, message.text))
                if message.type in ("error", "warning") else None)
        page.on("pageerror", lambda error: problems.append((page.url, str(error))))
        try:
            page.goto(f"{base}/docs")
            page.wait_for_selector(".opblock")
            rendered = sorted(zip(page.eval_on_selector_all(".opblock", "els => els.map(e => [...e.classList]"
                                                            ".find(c => c.startsWith('opblock-') && c !== "
                                                            "'opblock-deprecated').slice(8))"),
                                  page.eval_on_selector_all(".opblock .opblock-summary-path",
                                                            "els => els.map(e => e.dataset.path)"), strict=True))
            assert rendered == sorted(operations)
            page.screenshot(path=tmp_path / "swagger-ui.png", full_page=True)
            # the page's policy still lets "Try it out" call the service itself
            healthz = "#operations-default-healthz_healthz_get"
            for button in (".opblock-summary", ".try-out__btn", ".execute"):
                page.click(f"{healthz} {button}")
            answer = page.locator(f"{healthz} .live-responses-table td.response-col_status:not(.col_header)")
            answer.wait_for()
            assert answer.inner_text().strip() == "200"

            page.goto(f"{base}/redoc")
            page.wait_for_selector("[data-section-id^='operation/'], [data-section-id*='/operation/']")
            listed = page.eval_on_selector_all("[data-section-id]", "els => els.map(e => e.dataset.sectionId)")
            operation_ids = {s.rsplit("operation/", 1)[1] for s in listed if "operation/" in s}
            assert operation_ids == set(operations.values()), sorted(operation_ids)
            text = page.inner_text("body")
            assert SERVICES[kind] in text and "/healthz" in text
            page.screenshot(path=tmp_path / "redoc.png")
        except BaseException:
            page.screenshot(path=tmp_path / "failed.png", full_page=True)
            raise
    assert elsewhere == [], elsewhere  # nothing was even attempted off the service's host
    assert {f"{base}/docs-assets/{name}" for name in ("swagger-ui-bundle.js", "swagger-ui.css",
                                                       "redoc.standalone.js")} <= set(loaded)
    assert len(problems) == 1, problems  # the logo's refusal only: no other refusal, failed load or script error
    where, message = problems[0]
    assert where == f"{base}/redoc" and REDOC_LOGO in message and "Content Security Policy" in message, problems
