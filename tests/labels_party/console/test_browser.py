"""The console in a real browser: Debian's chromium (``make test`` installs it; Playwright never downloads one),
driven by Playwright against the labels service served by uvicorn on loopback. An admin signs in through the
form (a consumer key is refused), the pages show the budget the API answers, the audit verifies, the session
cookie is HttpOnly/SameSite=Strict and scripts cannot read it, the page loads nothing from anywhere else and
breaks no Content-Security-Policy rule, and signing out ends the session. Screenshots of every page are written
to the test's ``tmp_path``."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from labeldp.local_services import serve_in_thread
from labels_party.http.api import create_app
from labels_party.http.auth import create_key
from labels_party.runtime.context import make_context
from tests.support.browser import chromium


@pytest.fixture
def service(tmp_path):
    ctx = make_context(f"sqlite:///{tmp_path}/db.sqlite", tmp_path / "data")
    with ctx.sessions() as session, session.begin():
        admin = create_key(ctx.ledger, session, "statistics-office", "admin")
        consumer = create_key(ctx.ledger, session, "publisher", "consumer")
    with serve_in_thread(create_app(ctx)) as base:
        owner = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {admin}"}, timeout=60)
        publisher = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {consumer}"}, timeout=60)
        r = owner.post("/v1/datasets", json={"name": "hours worked", "label_kind": "integer", "min": 0, "max": 60,
                                             "epsilon_total": 4})
        assert r.status_code == 201, r.text
        dataset = r.json()["id"]
        labels = np.random.default_rng(5).integers(0, 61, size=1500)
        r = owner.put(f"/v1/datasets/{dataset}/labels", headers={"Content-Type": "text/csv"},
                      content="example_id,label\n" + "".join(f"w{i},{v}\n" for i, v in enumerate(labels)))
        assert r.status_code == 200, r.text
        assert owner.post(f"/v1/datasets/{dataset}/grants", json={"org": "publisher", "epsilon": 3}).status_code == 201
        releases = []
        for key, body in (("a", {"mechanism": "opt-unbiased", "epsilon": 1}),
                          ("b", {"mechanism": "laplace", "epsilon": 0.5, "example_ids": ["w1", "w2", "w3"]})):
            r = publisher.post(f"/v1/datasets/{dataset}/releases", json=body, headers={"Idempotency-Key": key})
            assert r.status_code == 201, r.text
            releases.append(r.json()["id"])
        yield {"base": base, "admin": admin, "consumer": consumer, "dataset": dataset, "releases": releases,
               "owner": owner}
        owner.close()
        publisher.close()


def test_the_console_in_chromium(service, tmp_path):
    base, dataset = service["base"], service["dataset"]
    api_budget = service["owner"].get(f"/v1/datasets/{dataset}/budget").json()
    assert api_budget["epsilon_spent"] == 1.5
    requests, problems = [], []
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1100, "height": 900})
        page.on("request", lambda request: requests.append(request.url))
        page.on("console", lambda message: problems.append(message.text) if message.type in ("error", "warning")
                else None)
        step = "start"
        try:
            step = "sign-in"
            page.goto(f"{base}/console/datasets")
            assert page.url == f"{base}/console/sign-in"  # redirected: no session yet
            page.fill("#api_key", service["consumer"])
            page.click("#sign-in")
            assert "admin keys" in page.inner_text("#sign-in-error")
            assert problems == ["Failed to load resource: the server responded with a status of 403 (Forbidden)"]
            problems.clear()  # that refusal was the point; from here on nothing may fail to load
            assert page.input_value("#api_key") == ""  # the key is not put back into the page
            page.fill("#api_key", service["admin"])
            page.click("#sign-in")
            assert page.url == f"{base}/console/datasets"
            page.screenshot(path=tmp_path / "datasets.png", full_page=True)

            step = "datasets"
            card = page.locator(f"#dataset-{dataset}")
            for name in ("epsilon_total", "epsilon_spent", "epsilon_remaining"):
                assert float(card.locator(f"[data-budget={name}]").inner_text()) == api_budget[name]
            assert "publisher" in card.inner_text()
            cookies = {c["name"]: c for c in page.context.cookies()}
            session = cookies["labeldp_console"]
            assert session["httpOnly"] and session["sameSite"] == "Strict" and session["path"] == "/console"
            assert service["admin"] not in session["value"]
            assert page.evaluate("document.cookie") == ""  # scripts cannot read the session

            step = "dataset"
            page.click(f"#dataset-{dataset} h2 a")
            assert page.url == f"{base}/console/datasets/{dataset}"
            for name in ("epsilon_total", "epsilon_spent", "epsilon_remaining"):
                assert float(page.inner_text(f"#budget [data-budget={name}]")) == api_budget[name]
            assert page.locator("#timeline svg circle").count() == 3  # the start and two releases
            assert page.inner_text("#chain-status") == "valid"
            page.screenshot(path=tmp_path / "dataset.png", full_page=True)

            step = "verify"
            page.click("#verify")
            assert page.inner_text("#verify-result").startswith("VALID")
            page.screenshot(path=tmp_path / "verify.png", full_page=True)

            step = "release"
            page.goto(f"{base}/console/datasets/{dataset}")
            page.click("#releases tbody tr:first-child a")
            assert page.url == f"{base}/console/releases/{service['releases'][0]}"
            heatmap = page.locator('svg[aria-label="randomizer heatmap"]')
            assert heatmap.count() == 1 and heatmap.bounding_box()["width"] > 100
            page.screenshot(path=tmp_path / "release.png", full_page=True)

            step = "sign-out"
            page.click("#sign-out")
            assert page.url == f"{base}/console/sign-in"
            assert "labeldp_console" not in {c["name"] for c in page.context.cookies()}
            page.goto(f"{base}/console/datasets/{dataset}")
            assert page.url == f"{base}/console/sign-in"
        except BaseException:
            page.screenshot(path=tmp_path / f"failed-at-{step}.png", full_page=True)
            raise
    assert requests and all(url.startswith(f"{base}/console/") for url in requests), requests
    assert not problems, problems  # no CSP violation, no failed load
