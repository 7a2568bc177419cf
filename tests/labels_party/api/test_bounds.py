"""Bounded responses and work: small responses whatever |Y| is, domains beyond a solver's reach refused up front,
solves past the time limit refused with 503 (nothing charged, nothing written), unauthenticated bodies refused
before they are read — measured on a real server process (peak RSS from /proc)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from labeldp.local_services import free_port, serve_process
from labels_party.http.api import create_app
from labels_party.http.auth import create_key
from labels_party.ledger import documents
from labels_party.runtime.context import make_context
from labels_party.runtime.settings import LabelsSettings

MB = 1 << 20


def _cpu_seconds(pid: int) -> float:
    """CPU time a process has used (user and system, all its threads), in seconds."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime: fields 14 and 15


def _memory(pid: int) -> dict[str, int]:
    """Current and peak resident memory of a process, in bytes."""
    fields = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                fields[name] = int(value.split()[0]) * 1024
    return fields


@contextlib.contextmanager
def labels_server(tmp_path):
    """`labeldp labels serve` as its own process; yields (base url, pid, admin key, consumer key)."""
    env = {**os.environ, "LABELDP_DATABASE_URL": f"sqlite:///{tmp_path}/db.sqlite",
           "LABELDP_DATA_DIR": str(tmp_path / "data")}
    cli = [sys.executable, "-m", "labeldp", "labels"]
    keys = [subprocess.run(cli + ["create-key", "--org", org, "--role", role], env=env, capture_output=True,
                           text=True, check=True).stdout.strip()
            for org, role in (("owner", "admin"), ("publisher", "consumer"))]
    port = free_port()
    with serve_process(cli + ["serve", "--port", str(port)], f"http://127.0.0.1:{port}", env=env) as server:
        yield f"http://127.0.0.1:{port}", server.pid, *keys


def _dataset(http, admin, consumer_org, values, **domain):
    as_admin = {"Authorization": f"Bearer {admin}"}
    dataset = http.post("/v1/datasets", headers=as_admin,
                        json={"name": f"d{len(values)}", "epsilon_total": 10, **domain}).json()
    csv = "example_id,label\n" + "".join(f"e{i},{v}\n" for i, v in enumerate(values))
    assert http.put(f"/v1/datasets/{dataset['id']}/labels", content=csv,
                    headers={**as_admin, "Content-Type": "text/csv"}).status_code == 200
    assert http.post(f"/v1/datasets/{dataset['id']}/grants", headers=as_admin,
                     json={"org": consumer_org, "epsilon": 10}).status_code == 201
    return dataset["id"]


@pytest.mark.slow
def test_wide_domains_stay_small_and_bounded(tmp_path):
    with labels_server(tmp_path) as (base, pid, admin, consumer), httpx.Client(base_url=base, timeout=300) as http:
        as_consumer = {"Authorization": f"Bearer {consumer}"}
        wide = _dataset(http, admin, "publisher", np.arange(3000), label_kind="integer", min=0, max=2999)
        warm = http.post(f"/v1/datasets/{wide}/releases", headers={**as_consumer, "Idempotency-Key": "warm"},
                         json={"mechanism": "rr", "epsilon": 1, "example_ids": ["e1"]})
        assert warm.status_code == 201
        before = _memory(pid)["VmRSS"]
        response = http.post(f"/v1/datasets/{wide}/releases", headers={**as_consumer, "Idempotency-Key": "rr"},
                             json={"mechanism": "rr", "epsilon": 1})
        assert response.status_code == 201, response.text
        assert len(response.content) < 64 * 1024
        assert _memory(pid)["VmHWM"] - before < 200 * MB
        document = http.get(f"/v1/mechanisms/{response.json()['mechanism_hash']}", headers=as_consumer).json()
        assert len(document["description"]["output_values"]) == 3000

        # prices in dollars: 18,498 integer labels
        prices = _dataset(http, admin, "publisher", np.arange(18_498), label_kind="integer", min=0, max=18_497)
        before = _memory(pid)["VmRSS"]
        for key, body in (("mesh", {"mechanism": "opt-unbiased", "epsilon": 1, "solver": "mesh"}),
                          ("continuous", {"mechanism": "opt-unbiased", "epsilon": 1, "solver": "continuous"})):
            cpu = _cpu_seconds(pid)
            refused = http.post(f"/v1/datasets/{prices}/releases", json=body,
                                headers={**as_consumer, "Idempotency-Key": key})
            assert refused.status_code == 400 and refused.json()["error"]["code"] == "domain_too_large"
            message = refused.json()["error"]["message"]
            assert "grid_size" in message or "continuous" in message
            # refused before any solve: the server's CPU time, which a loaded machine does not stretch as it does
            # the wall clock (a solve over 18,498 labels would take minutes of it)
            assert _cpu_seconds(pid) - cpu < 30
        for key, body in (("lap", {"mechanism": "laplace", "epsilon": 1}),
                          ("bins", {"mechanism": "rr-on-bins", "epsilon": 1})):  # O(|Y|) memory since issue 16
            released = http.post(f"/v1/datasets/{prices}/releases", headers={**as_consumer, "Idempotency-Key": key},
                                 json=body)
            assert released.status_code == 201, released.text
            assert len(released.content) < 64 * 1024
        assert _memory(pid)["VmHWM"] - before < 2048 * MB
        budget = http.get(f"/v1/datasets/{prices}/budget", headers=as_consumer).json()
        assert budget["epsilon_spent"] == 2.0  # laplace and rr-on-bins; nothing for the refusals


@pytest.mark.slow
def test_an_unauthenticated_sixty_megabyte_body_is_refused_unread(tmp_path):
    with labels_server(tmp_path) as (base, pid, admin, _), httpx.Client(base_url=base, timeout=300) as http:
        dataset = _dataset(http, admin, "publisher", [1, 2, 3], label_kind="integer", min=0, max=9)
        http.get("/v1/datasets", headers={"Authorization": f"Bearer {admin}"})  # warm up
        before = _memory(pid)["VmRSS"]

        def body():
            chunk = b"x" * MB
            for _ in range(60):
                yield chunk

        for path, method in ((f"/v1/datasets/{dataset}/releases", "POST"), ("/v1/datasets", "POST"),
                             (f"/v1/datasets/{dataset}/labels", "PUT"),
                             (f"/v1/datasets/{dataset}/prior-releases?epsilon=1", "POST")):
            with contextlib.suppress(httpx.TransportError):  # the server may close the connection mid-upload
                response = http.request(method, path, content=body(), headers={"Content-Type": "text/csv"})
                assert response.status_code == 401 and response.json()["error"]["code"] == "unauthorized"
        assert _memory(pid)["VmHWM"] - before < 50 * MB


@pytest.fixture()
def service(tmp_path):
    ctx = make_context(f"sqlite:///{tmp_path}/db.sqlite", tmp_path / "data",
                       settings=LabelsSettings(solver_seconds=1e-4))
    with ctx.sessions() as session, session.begin():
        admin = create_key(ctx.ledger, session, "owner", "admin")
    client = TestClient(create_app(ctx), raise_server_exceptions=False,
                        headers={"Authorization": f"Bearer {admin}"})
    dataset = client.post("/v1/datasets", json={"name": "d", "label_kind": "integer", "min": 1, "max": 52,
                                                "epsilon_total": 10}).json()["id"]
    csv = "example_id,label\n" + "".join(f"e{i},{1 + i % 52}\n" for i in range(500))
    assert client.put(f"/v1/datasets/{dataset}/labels", content=csv,
                      headers={"Content-Type": "text/csv"}).status_code == 200
    return client, dataset, tmp_path / "data" / "releases"


@pytest.mark.parametrize("body", [{"mechanism": "opt-unbiased", "epsilon": 1, "solver": "continuous"},
                                  {"mechanism": "opt-unbiased", "epsilon": 1, "mesh": 104},
                                  {"mechanism": "rr-on-bins", "epsilon": 1}], ids=["continuous", "mesh", "bins"])
def test_a_solve_past_the_time_limit_falls_back_and_is_charged(service, body):
    """The solve runs on the noisy prior, a private quantity: how long it takes depends on the labels. So a solve
    past the limit is not a refusal (which would be free and label-dependent) but the family's fallback, built
    from public inputs (dbRR, unbiased), charged like any release and saying so in its description."""
    client, dataset, releases = service
    response = client.post(f"/v1/datasets/{dataset}/releases", json=body, headers={"Idempotency-Key": "t"})
    assert response.status_code == 201, response.text
    description = response.json()["description"]
    assert (description["fallback"], description["fallback_from"], description["reason"]) == \
        ("dbrr", body["mechanism"], "solver_timeout")
    assert description["mechanism"] == "dbrr" and description["certified_epsilon"] <= 1.0
    assert client.get(f"/v1/datasets/{dataset}/budget").json()["epsilon_spent"] == 1.0
    assert client.get(f"/v1/releases/{response.json()['id']}/labels").status_code == 200


def test_the_openapi_documents_the_refusals(service):
    client, _, _ = service
    operation = client.get("/openapi.json").json()["paths"]["/v1/datasets/{dataset_id}/releases"]["post"]
    assert {"400", "401", "404", "409", "413", "422", "503"} <= set(operation["responses"])
    schema = operation["responses"]["400"]["content"]["application/json"]["schema"]["$ref"]
    assert schema.endswith("/ErrorBody")


def test_mechanism_documents_in_compact_binary(service):
    client, dataset, _ = service
    release = client.post(f"/v1/datasets/{dataset}/releases", json={"mechanism": "dbrr", "epsilon": 4},
                          headers={"Idempotency-Key": "doc"})
    assert release.status_code == 201, release.text
    digest = release.json()["mechanism_hash"]
    as_json = client.get(f"/v1/mechanisms/{digest}").json()
    assert len(as_json["description"]["output_values"]) == 52
    binary = client.get(f"/v1/mechanisms/{digest}", headers={"Accept": documents.BINARY_MEDIA_TYPE})
    assert binary.headers["content-type"] == documents.BINARY_MEDIA_TYPE
    assert documents.unpack(binary.content) == as_json
    assert documents.address(as_json) == digest  # content-addressed


def test_documents_pack_and_summary():
    document = {"description": {"mechanism": "m", "values": [1, 2, 3], "matrix": [[1, 2], [3, 4]],
                                "mixed": [1, "a"], "nested": {"scale": 2.5, "weights": [0.5, 0.25]}},
                "noisy_prior": None}
    assert documents.unpack(documents.pack(document)) == document
    assert documents.summary(document) == {"description": {"mechanism": "m", "nested": {"scale": 2.5}},
                                           "noisy_prior": None}


def test_solvers_honour_the_deadline_and_domains_beyond_them_are_refused():
    from labels_party.core.registry import MechanismOptions, build_mechanism
    from labels_party.core.solvers.deadline import Deadline, SolverTimeout
    from shared.domains import integer_range
    from shared.errors import LabelDPError

    prior = np.linspace(1, 2, 52)
    for options in (MechanismOptions(solver="continuous", deadline=Deadline(1e-4)),
                    MechanismOptions(mesh=104, deadline=Deadline(1e-4))):
        with pytest.raises(SolverTimeout):
            build_mechanism("opt-unbiased", integer_range(1, 52), 1.0, prior, options)
    assert build_mechanism("opt-unbiased", integer_range(1, 52), 1.0, prior,
                           MechanismOptions(solver="continuous", deadline=Deadline(60))).certified_epsilon <= 1.0
    too_wide = (("opt-unbiased", 1001, MechanismOptions()), ("opt-unbiased", 142, MechanismOptions(solver="mesh")),
                ("rr-on-bins", 50_001, MechanismOptions()))
    for name, size, options in too_wide:
        with pytest.raises(LabelDPError) as err:
            build_mechanism(name, integer_range(0, size - 1), 1.0, np.ones(size), options)
        assert err.value.code == "domain_too_large"
    with pytest.raises(SolverTimeout):  # 141 x 280 = 39,480 cells: inside the mesh limit, so it is tried
        build_mechanism("opt-unbiased", integer_range(0, 140), 1.0, np.ones(141),
                        MechanismOptions(mesh=280, deadline=Deadline(1e-4)))
