"""The features party's httpx client against a real labels-party server: retries keep the Idempotency-Key (a lost
response never causes a second draw or charge), and 401/404/409 raise specific exceptions."""

from __future__ import annotations

import json
import threading
import time

import httpx
import numpy as np
import pandas as pd
import pytest
from sqlalchemy import select

from features_party.client import BudgetExceeded, Conflict, LabelsPartyClient, NotFound, Unauthorized
from labeldp.local_services import serve_in_thread
from labels_party.http.api import create_app
from labels_party.http.auth import create_key
from labels_party.runtime.context import make_context
from labels_party.runtime.settings import LabelsSettings
from labels_party.store.db import Organization
from shared.errors import LabelDPError
from shared.estimates import unbiased_mse_estimate_from_document


class FaultInjector(httpx.HTTPTransport):
    """Forwards to the real server but injects failures: 'refuse' (connection error before the request),
    'lose' (the server handles the request, then the response is lost), '503' (a proxy answers 503)."""

    def __init__(self, faults: list[str]):
        super().__init__()
        self.faults = faults
        self.keys: list[str | None] = []
        self.answered = threading.Event()  # the server answered a request (the first: the others do not reset it)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.keys.append(request.headers.get("Idempotency-Key"))
        fault = self.faults.pop(0) if self.faults else None
        if fault == "refuse":
            raise httpx.ConnectError("injected", request=request)
        if fault == "503":
            return httpx.Response(503, json={"error": {"code": "unavailable", "message": "injected"}})
        response = super().handle_request(request)
        self.answered.set()
        if fault == "lose":
            response.read()
            response.close()
            raise httpx.ReadError("injected: response lost", request=request)
        return response


@pytest.fixture()
def service(tmp_path):
    ctx = make_context(f"sqlite:///{tmp_path}/db.sqlite", tmp_path / "data")
    with ctx.sessions() as session, session.begin():
        keys = {"admin": create_key(ctx.ledger, session, "office", "admin"),
                "partner": create_key(ctx.ledger, session, "pub", "consumer"),
                "stranger": create_key(ctx.ledger, session, "other", "consumer")}
    with serve_in_thread(create_app(ctx)) as base:
        with LabelsPartyClient(base, keys["admin"]) as owner:
            dataset = owner.create_dataset(name="d", label_kind="integer", min=0, max=20, epsilon_total=1.5)
            labels = np.random.default_rng(1).integers(0, 21, size=500)
            owner.upload_labels(dataset.id, [f"id{i}" for i in range(500)], labels)
            owner.grant(dataset.id, "pub", 1.5)
        yield base, keys, dataset.id, labels


@pytest.mark.parametrize("faults", [["refuse"], ["503", "503"], ["lose"], ["lose", "refuse", "503"]])
def test_retries_reuse_the_key_and_never_double_charge(service, faults):
    base, keys, dataset, _ = service
    transport = FaultInjector(list(faults))
    with LabelsPartyClient(base, keys["partner"], transport=transport, backoff=0.01) as client:
        release = client.request_release(dataset, {"mechanism": "rr", "epsilon": 1.0})
        assert len(set(transport.keys)) == 1 and len(transport.keys) == len(faults) + 1
        assert client.budget(dataset).epsilon_spent == pytest.approx(1.0)
    with LabelsPartyClient(base, keys["admin"]) as owner:
        assert len(owner.audit(dataset).events) == 1
        assert owner.audit(dataset).events[0].record["release_id"] == release.id


class BodyRecorder(httpx.HTTPTransport):
    """Forwards to the real server and keeps the JSON body of every request it sends."""

    def __init__(self):
        super().__init__()
        self.bodies: list[dict] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.headers.get("content-type") == "application/json":
            self.bodies.append(json.loads(request.read()))
        return super().handle_request(request)


def test_a_release_request_sends_the_uninformative_opt_in_only_when_given(service):
    """A labels party from before ``allow_uninformative`` forbids fields it does not know: a request that does not
    opt in must not name the field (nor unset options), so a new client still talks to it."""
    base, keys, dataset, _ = service
    transport = BodyRecorder()
    with LabelsPartyClient(base, keys["partner"], transport=transport) as client:
        client.request_release(dataset, {"mechanism": "rr", "epsilon": 0.5})
        client.request_release(dataset, {"mechanism": "rr", "epsilon": 0.5, "allow_uninformative": True})
    assert transport.bodies == [{"mechanism": "rr", "epsilon": 0.5, "clip": False},
                                {"mechanism": "rr", "epsilon": 0.5, "clip": False, "allow_uninformative": True}]


def test_download_returns_the_released_labels(service):
    base, keys, dataset, labels = service
    with LabelsPartyClient(base, keys["partner"]) as client:
        release = client.request_release(dataset, {"mechanism": "laplace", "epsilon": 1.0})
        table = client.download_labels(release.id)
    assert table.num_rows == 500 and table.column("example_id").to_pylist()[:2] == ["id0", "id1"]
    noisy = table.column("label").to_numpy()
    assert not np.array_equal(noisy, labels)
    assert abs(np.mean(noisy - labels)) < 5 * np.std(noisy - labels) / np.sqrt(500)


def test_errors_become_specific_exceptions(service):
    base, keys, dataset, _ = service
    with LabelsPartyClient(base, "ldp_wrong_key") as client, pytest.raises(Unauthorized):
        client.budget(dataset)
    with LabelsPartyClient(base, keys["stranger"]) as client, pytest.raises(NotFound):
        client.request_release(dataset, {"mechanism": "rr", "epsilon": 0.1})
    with LabelsPartyClient(base, keys["partner"]) as client:
        client.request_release(dataset, {"mechanism": "rr", "epsilon": 1.0}, idempotency_key="same")
        with pytest.raises(Conflict) as conflict:
            client.request_release(dataset, {"mechanism": "rr", "epsilon": 0.2}, idempotency_key="same")
        assert conflict.value.code == "idempotency_conflict"
        with pytest.raises(BudgetExceeded) as exceeded:
            client.request_release(dataset, {"mechanism": "rr", "epsilon": 1.0})
        # its own figures are at budget(); the refusal says nothing of any other organization's use
        assert set(exceeded.value.body["error"]) == {"code", "message"}
        assert client.budget(dataset).epsilon_remaining == pytest.approx(0.5)


def test_a_clipped_dataset_through_the_client(service):
    """The client sends a clip as the clip (not also as min/max, which the service refuses) and reads the counts."""
    base, keys, _, _ = service
    with LabelsPartyClient(base, keys["admin"]) as owner:
        dataset = owner.create_dataset(name="clipped", label_kind="integer", clip={"low": 0, "high": 10},
                                       epsilon_total=1)
        assert dataset.domain == {"kind": "integer", "min": 0, "max": 10, "clip": {"low": 0.0, "high": 10.0}}
        uploaded = owner.upload_labels(dataset.id, ["a", "b", "c", "d"], [-2, 4, 11, 30])
        assert (uploaded.clipped_below, uploaded.clipped_above) == (1, 2)
        assert [u.clipped_above for u in owner.audit(dataset.id).uploads] == [2]


def test_frames_and_the_test_mse_estimate_through_the_client(service):
    """A dataset from a frame, a held-out release downloaded as a frame, and the unbiased test-MSE estimate from the
    release's document: the one the shared function computes, close to the truth; refused without predictions for
    every released example and for a biased mechanism."""
    base, keys, _, _ = service
    rng = np.random.default_rng(4)
    frame = pd.DataFrame({"id": [f"x{i}" for i in range(600)], "y": rng.integers(0, 21, size=600)})
    with LabelsPartyClient(base, keys["admin"]) as owner:
        dataset = owner.create_dataset(name="frame", label_kind="integer", min=0, max=20, epsilon_total=2).id
        with pytest.raises(LabelDPError, match="no column 'example_id'"):
            owner.upload_frame(dataset, frame)
        assert owner.upload_frame(dataset, frame, id_column="id", label_column="y").num_examples == 600
        owner.grant(dataset, "pub", 2)
    predictions = pd.Series(frame.y.to_numpy() + rng.normal(0, 2, size=600), index=frame.id)
    held_out, other = frame.id[:400].tolist(), frame.id[400:].tolist()
    with LabelsPartyClient(base, keys["partner"]) as client:
        release = client.request_release(dataset, {"mechanism": "dbrr", "epsilon": 1.0, "example_ids": held_out})
        released = client.download_frame(release.id)
        assert list(released.columns) == ["example_id", "label"] and released.example_id.tolist() == held_out
        estimate = client.estimate_test_mse(release.id, predictions)  # 200 predictions more than released: ignored
        document = client.mechanism_document(release.mechanism_hash)
        assert estimate == unbiased_mse_estimate_from_document(predictions[held_out], released.label, document)
        truth = float(np.mean((predictions[:400] - frame.y[:400].to_numpy()) ** 2))
        assert abs(estimate.estimate - truth) < 5 * estimate.standard_error
        assert estimate.confidence_interval[0] < estimate.estimate < estimate.confidence_interval[1]
        with pytest.raises(LabelDPError, match="100 of the release's 400 examples have no prediction"):
            client.estimate_test_mse(release.id, predictions[100:])
        # A job's predictions frame: its holdout column says which examples the model did not train on
        job_frame = pd.DataFrame({"example_id": frame.id, "prediction": predictions.to_numpy(),
                                  "holdout": frame.id.isin(held_out).to_numpy()})
        assert client.estimate_test_mse(release.id, job_frame) == estimate
        assert client.estimate_test_mse(release.id, predictions, holdout=job_frame.holdout.to_numpy()) == estimate
        job_frame.loc[[3, 7], "holdout"] = False  # two released examples the model trained on
        for given in (job_frame, job_frame.set_index("example_id")):
            with pytest.raises(LabelDPError, match="2 of the release's 400 examples were trained on") as trained:
                client.estimate_test_mse(release.id, given)
            assert trained.value.code == "not_held_out"
        with pytest.raises(LabelDPError) as trained:
            client.estimate_test_mse(release.id, predictions, holdout=job_frame.set_index("example_id").holdout)
        assert trained.value.code == "not_held_out"
        for holdout in (np.ones(5, dtype=bool), np.ones(600), pd.Series(True, index=frame.id[:10])):
            with pytest.raises(LabelDPError) as malformed:
                client.estimate_test_mse(release.id, predictions, holdout=holdout)
            assert malformed.value.code == "invalid_input"
        biased = client.request_release(dataset, {"mechanism": "laplace", "clip": True, "epsilon": 1.0,
                                                  "example_ids": other})
        with pytest.raises(LabelDPError) as refused:
            client.estimate_test_mse(biased.id, predictions)
        assert refused.value.code == "mechanism_biased"
        # the dataset's integer labels lie on Laplace's lattice (step 1): nothing is rounded, nothing to own up to
        laplace = client.request_release(dataset, {"mechanism": "laplace", "epsilon": 1.0, "example_ids": other})
        on_lattice = client.estimate_test_mse(laplace.id, predictions)
        assert (on_lattice.rounding_bound, on_lattice.bias_bound) == (0.0, 0.0)
        half = 1.959964 * on_lattice.standard_error
        assert on_lattice.confidence_interval == pytest.approx((on_lattice.estimate - half, on_lattice.estimate + half))


def test_a_retry_while_the_first_call_computes_waits_for_its_outcome(tmp_path):
    """The first call's response is lost while the labels party is still computing its release (charged): the
    retry with the same key meets 409 release_in_progress and polls until the outcome is there — the same release,
    one charge."""
    import threading

    charged, proceed = threading.Event(), threading.Event()

    def checkpoint(name):
        if name == "after_charge_commit" and not charged.is_set():
            charged.set()
            assert proceed.wait(60)

    ctx = make_context(f"sqlite:///{tmp_path}/db.sqlite", tmp_path / "data", checkpoint=checkpoint)
    with ctx.sessions() as session, session.begin():
        admin = create_key(ctx.ledger, session, "office", "admin")
        partner = create_key(ctx.ledger, session, "pub", "consumer")
    with serve_in_thread(create_app(ctx)) as base:
        with LabelsPartyClient(base, admin) as owner:
            dataset = owner.create_dataset(name="d", label_kind="integer", min=0, max=20, epsilon_total=1.5)
            owner.upload_labels(dataset.id, [f"e{i}" for i in range(100)], np.arange(100) % 21)
            owner.grant(dataset.id, "pub", 1.5)
        first = {}
        thread = threading.Thread(target=lambda: first.update(release=LabelsPartyClient(base, partner).request_release(
            dataset.id, {"mechanism": "rr", "epsilon": 1.0}, idempotency_key="same")))
        thread.start()
        assert charged.wait(60)
        threading.Timer(3.0, proceed.set).start()  # the computation ends 3 s later, after a 409 or two
        with LabelsPartyClient(base, partner) as client:
            retried = client.request_release(dataset.id, {"mechanism": "rr", "epsilon": 1.0}, idempotency_key="same")
            thread.join(60)
            assert retried.id == first["release"].id
            assert client.budget(dataset.id).epsilon_spent == 1.0


def test_a_release_over_the_quota_is_retried_after_its_retry_after(tmp_path):
    """The organization's one release slot is taken (held here, as a release being computed would): the first
    call gets 429 release_quota_exceeded with Retry-After: 1, the client waits and sends it again with the same
    key, and the release is made once."""
    settings = LabelsSettings(release_slots_per_org=1, release_queue_seconds=0)
    ctx = make_context(f"sqlite:///{tmp_path}/db.sqlite", tmp_path / "data", settings=settings)
    with ctx.sessions() as session, session.begin():
        keys = {"admin": create_key(ctx.ledger, session, "office", "admin"),
                "partner": create_key(ctx.ledger, session, "pub", "consumer")}
    with ctx.sessions() as session:
        partner_org = session.scalar(select(Organization.id).where(Organization.name == "pub"))
    with serve_in_thread(create_app(ctx)) as base:
        with LabelsPartyClient(base, keys["admin"]) as owner:
            dataset = owner.create_dataset(name="d", label_kind="integer", min=0, max=20, epsilon_total=1)
            owner.upload_labels(dataset.id, [f"id{i}" for i in range(100)], [i % 21 for i in range(100)])
            owner.grant(dataset.id, "pub", 1)
        transport = FaultInjector([])  # records the requests; injects nothing
        taken, done = threading.Event(), threading.Event()

        def hold() -> None:  # until the client's first request was answered (429): never a race with a slow server
            with ctx.quotas.slot(partner_org):
                taken.set()
                transport.answered.wait(60)
            done.set()

        holder = threading.Thread(target=hold)
        holder.start()
        assert taken.wait(10)
        with LabelsPartyClient(base, keys["partner"], transport=transport, retries=2) as client:
            started = time.monotonic()
            release = client.request_release(dataset.id, {"mechanism": "rr", "epsilon": 1.0})
            assert time.monotonic() - started >= 1  # Retry-After: 1
            assert client.budget(dataset.id).epsilon_spent == pytest.approx(1.0)
        holder.join()
    posts = [key for key in transport.keys if key is not None]  # the release's requests (the budget's has none)
    assert len(posts) == 2 and len(set(posts)) == 1 and release.state == "available"
