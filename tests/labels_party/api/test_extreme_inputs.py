"""Extreme numbers in requests get a documented 4xx, never a 500 or a body that is not JSON (issue 28, item 7).

Label domains of huge, tiny, infinite or NaN bounds, wide grids, clip ranges at the limits, for every regression
mechanism (opt-unbiased on [−10³⁰⁰, 10³⁰⁰] answered a 500, "Out of range float values are not JSON compliant"):
a dataset is created or refused with a 4xx; an accepted one takes labels at its bounds and every release is a 201
whose numbers are all finite or a 4xx. The same for ``labeldp randomizer solve --json``: one JSON document with
finite numbers, or one line on stderr and exit 2. Hypothesis, 60 + 40 examples: ~30 s.
"""

from __future__ import annotations

import json
import math

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from labeldp.cli import main
from labels_party.http.api import create_app
from labels_party.http.auth import create_key
from labels_party.runtime.context import make_context
from shared.errors import ErrorCode
from tests.labels_party.api.helpers import bearer

pytestmark = pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient`")

EXTREMES = [0.0, 1e-300, 5e-324, 1.0, 1e15, 1e15 + 2, 1e16, 1e300, 1.7976931348623157e308, math.inf, math.nan]
_EXTREME = st.sampled_from(EXTREMES + [-v for v in EXTREMES])
_ORDINARY = st.one_of(st.floats(-1e15, 1e15, allow_nan=False), st.integers(-10**15, 10**15).map(float),
                      st.integers(-100, 100).map(float))
BOUND = st.one_of(_EXTREME, _ORDINARY, _ORDINARY)  # two in three within the limit, where the releases are
MECHANISMS = [("opt-unbiased", {}), ("opt-unbiased", {"mesh": 20}), ("rr-on-bins", {}), ("laplace", {}),
              ("laplace", {"clip": True}), ("staircase", {"clip": True}), ("dbrr", {}), ("rr", {})]
DOCUMENTED_4XX = {code.value for code in ErrorCode if 400 <= code.status < 500}


def _raw_json(body: dict) -> str:
    """The body as a client may send it: NaN and Infinity as the tokens Python's parser accepts."""
    return json.dumps(body, allow_nan=True)


def _strict(text: str):
    """Parse JSON refusing NaN and Infinity (what a strict client does)."""
    def refuse(token):
        raise AssertionError(f"not JSON: {token}")
    return json.loads(text, parse_constant=refuse)


def _finite_numbers(value) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite_numbers(v) for v in value.values())
    if isinstance(value, list):
        return all(_finite_numbers(v) for v in value)
    return True


def _refused(response, statuses=(400, 409, 422)) -> None:
    assert response.status_code in statuses, response.text
    error = _strict(response.text)["error"]
    assert error["code"] in DOCUMENTED_4XX and error["message"]


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("extreme")
    ctx = make_context(f"sqlite:///{tmp}/db.sqlite", tmp / "data")
    with ctx.sessions() as session, session.begin():
        admin = bearer(create_key(ctx.ledger, session, "hospital", "admin"))
    with TestClient(create_app(ctx), raise_server_exceptions=False) as client:
        yield client, admin


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bounds=st.lists(BOUND, min_size=2, max_size=2).map(lambda b: sorted(b, key=lambda v: (math.isnan(v), v))),
       kind=st.sampled_from(["continuous", "integer", "finite"]), clip=st.booleans(),
       grid=st.sampled_from([2, 101, 10_000]), mechanism=st.sampled_from(MECHANISMS),
       epsilon=st.sampled_from([0.001, 1.0, 50.0]))
def test_extreme_domains_get_a_4xx_or_finite_releases(service, bounds, kind, clip, grid, mechanism, epsilon):
    client, admin = service
    low, high = bounds
    body: dict = {"name": f"d-{low!r}-{high!r}-{kind}-{clip}-{grid}-{mechanism}-{epsilon}", "epsilon_total": 100,
                  "label_kind": kind}
    if kind == "finite":
        body["values"] = [low, high]
    else:
        body.update({"clip": {"low": low, "high": high}} if clip else {"min": low, "max": high})
        if kind == "continuous" or grid != 101:
            body["grid_size"] = grid
    created = client.post("/v1/datasets", content=_raw_json(body),
                          headers={**admin, "Content-Type": "application/json"})
    event(f"dataset {created.status_code}")
    if created.status_code != 201:
        return _refused(created)
    dataset = created.json()["id"]
    assert _finite_numbers(created.json()["domain"])
    labels = "example_id,label\n" + "".join(f"e{i},{v!r}\n" for i, v in enumerate([low, high] * 10))
    uploaded = client.put(f"/v1/datasets/{dataset}/labels", content=labels,
                          headers={**admin, "Content-Type": "text/csv"})
    if uploaded.status_code != 200:
        return _refused(uploaded, (400,))
    name, options = mechanism
    released = client.post(f"/v1/datasets/{dataset}/releases", headers={**admin, "Idempotency-Key": "x"},
                           json={"mechanism": name, "epsilon": epsilon, **options})
    event(f"release {released.status_code}")
    if released.status_code != 201:
        return _refused(released, (400, 409))
    assert _finite_numbers(_strict(released.text))
    document = client.get(f"/v1/mechanisms/{released.json()['mechanism_hash']}", headers=admin)
    assert document.status_code == 200 and _finite_numbers(_strict(document.text))
    download = client.get(f"/v1/releases/{released.json()['id']}/labels", headers=admin)
    assert download.status_code == 200
    assert all(math.isfinite(float(line.split(",")[1])) for line in download.text.splitlines()[1:])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(BOUND, min_size=2, max_size=5), mechanism=st.sampled_from(MECHANISMS),
       epsilon=st.sampled_from([0.5, 1.0, 8.0]))
def test_the_cli_prints_one_json_document_or_one_line(capsys, values, mechanism, epsilon):
    name, options = mechanism
    spec = ",".join(repr(float(v)) for v in sorted(values))
    argv = ["randomizer", "solve", "--mechanism", name, f"--labels={spec}", "--epsilon", str(epsilon), "--json"]
    argv += ["--mesh", str(options["mesh"])] if "mesh" in options else []
    argv += ["--clip"] if options.get("clip") else []
    code = main(argv)
    out, err = capsys.readouterr()
    event(f"exit {code}")
    if code == 0:
        assert _finite_numbers(_strict(out)) and err == ""
    else:
        assert code == 2 and out == "" and err.startswith("labeldp: error: ") and err.count("\n") == 1, err
