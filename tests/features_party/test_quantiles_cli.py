"""``labeldp quantiles`` against a labels party on loopback, through the SDK client: the values, the charge, an
idempotent retry, and one-line errors."""

from __future__ import annotations

import contextlib
import json
import warnings
from pathlib import Path

import numpy as np
import pytest

from labeldp.cli import main
from labeldp.local_services import serve_in_thread

with warnings.catch_warnings():  # starlette: "Using `httpx` with `starlette.testclient` is deprecated"
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

LABELS = np.random.default_rng(3).integers(0, 101, size=600)


def labels_party(tmp: Path, stack: contextlib.ExitStack) -> dict:
    """A labels party serving an owner's dataset (integers 0..100, 600 labels, ε_total 1): its URL, the owner's key
    and the dataset id."""
    from labels_party.http.api import create_app
    from labels_party.http.auth import create_key
    from labels_party.runtime.context import make_context

    ctx = make_context(f"sqlite:///{tmp}/labels.db", tmp / "labels")
    with ctx.sessions() as session, session.begin():
        key = create_key(ctx.ledger, session, "shop", "admin")
    owner = TestClient(create_app(ctx), headers={"Authorization": f"Bearer {key}"})
    dataset = owner.post("/v1/datasets", json={"name": "d", "label_kind": "integer", "min": 0, "max": 100,
                                               "epsilon_total": 1.0}).json()["id"]
    owner.put(f"/v1/datasets/{dataset}/labels", headers={"Content-Type": "text/csv"},
              content="example_id,label\n" + "\n".join(f"x{i},{v}" for i, v in enumerate(LABELS)))
    url = stack.enter_context(serve_in_thread(create_app(ctx)))
    return {"url": url, "key": key, "dataset": dataset}


@pytest.fixture()
def party(tmp_path):
    with contextlib.ExitStack() as stack:
        yield labels_party(tmp_path, stack)


def _run(capsys, *args):
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _args(party: dict, *extra: str) -> list[str]:
    return ["quantiles", "--url", party["url"], "--key", party["key"], "--dataset", party["dataset"], *extra]


def test_values_on_stdout_the_charge_on_stderr_and_a_retry_charges_once(capsys, party):
    args = _args(party, "--quantiles", "0.1,0.9", "--epsilon", "0.4", "--idempotency-key", "clip-1")
    code, out, err = _run(capsys, *args)
    assert code == 0, err
    values = {float(q): float(v) for q, v in (line.split("\t") for line in out.splitlines())}
    assert list(values) == [0.1, 0.9]
    for q, value in values.items():  # ~6 labels a value, ε = 0.2 each: within a few values of the truth
        assert abs(value - np.quantile(LABELS, q)) <= 15
    assert "epsilon 0.4 charged to each of 600 examples" in err
    code, again, _ = _run(capsys, *args, "--json")
    release = json.loads(again)
    assert code == 0 and {float(q): v for q, v in release["description"]["values"].items()} == values
    assert release["charged_epsilon"] == 0.4 and release["mechanism"] == "quantiles"
    code, out, err = _run(capsys, *_args(party, "--quantiles", "0.5", "--epsilon", "0.7"))  # 0.4 + 0.7 > 1
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "labels_party_budget_exceeded" not in err and "budget_exceeded" in err


@pytest.mark.parametrize(("extra", "fragment"), [
    (["--quantiles", "0.9,0.1", "--epsilon", "0.1"], "sorted and distinct"),
    (["--quantiles", "0.1,x", "--epsilon", "0.1"], "--quantiles takes numbers"),
    (["--quantiles", "1.5", "--epsilon", "0.1"], "quantiles.0"),
])
def test_refusals_are_one_line_and_charge_nothing(capsys, party, extra, fragment):
    code, out, err = _run(capsys, *_args(party, *extra))
    assert code == 2 and out == "" and err.count("\n") == 1 and fragment in err, err
    code, out, _ = _run(capsys, *_args(party, "--quantiles", "0.5", "--epsilon", "1"))  # the whole budget is left
    assert code == 0


def test_an_unreachable_labels_party_is_one_line(capsys):
    code, out, err = _run(capsys, "quantiles", "--url", "http://127.0.0.1:9", "--key", "k", "--dataset", "d",
                          "--quantiles", "0.5", "--epsilon", "1")
    assert code == 2 and out == "" and err.startswith("labeldp: error: cannot reach the labels party")
