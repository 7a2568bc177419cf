"""The docker-compose stack, built and run for real (``make compose-demo``'s building blocks from
:mod:`labeldp.compose_stack`): an engine (Debian's dockerd started here as root when none runs), the images (the
registry's bases, or Debian's bootstrapped locally), ``docker-compose up`` with the Spark profile, keys through
``docker-compose exec``. Then the faults an operator meets:

* a labels replica's process crashes (SIGKILL from the host, as the OOM killer would) during a stream of releases
  (between requests: :class:`Between`) and its restart policy brings it back; another replica is
  ``docker kill``-ed and ``docker-compose up -d`` brings it back. Every logical request's retries (same
  Idempotency-Key) converge on one release; the ledger charged exactly one ε per release; ``verify-audit`` is
  clean.
* PostgreSQL restarted mid-run: once it is back, both replicas and the trainer are ready again and requests are
  answered without a 5xx (the pools' pre-ping).
* a source dataset released on the Spark cluster's executors (two workers), not in local mode.

Needs root or a running engine; CI (``.ci/run``, as root) sets LABELDP_TEST_COMPOSE=1, so there it fails instead
of skipping. Runtime: about 2 min with the images built (measured 112 s); a cold build adds about 7 min here
(bootstrap and import 53 s, the Python and PostgreSQL bases about 2 min, the party images 202 s); the bootstrapped
Debian base is cached under /var/cache/labeldp/images."""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import time
import uuid

import httpx
import numpy as np
import pytest

from features_party.client import LabelsPartyClient, ReleaseFailed
from labeldp.compose_stack import Stack, build_images, docker_engine, ensure_env_files, save_logs
from labeldp.demo_source import EPSILON as SOURCE_EPSILON
from labeldp.demo_source import run_round
from labeldp.local_services import free_port

pytestmark = pytest.mark.slow

EPSILON = 0.25  # per release of the stream
STREAMS, PER_STREAM = 3, 12
SIZE = 2_000


def _engine_possible() -> bool:
    if os.geteuid() == 0:
        return True
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        return subprocess.run(["docker", "info"], capture_output=True, timeout=20).returncode == 0
    return False


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    if not _engine_possible():
        if os.environ.get("LABELDP_TEST_COMPOSE"):
            pytest.fail("LABELDP_TEST_COMPOSE is set but no Docker engine can be used (not root, none running)")
        pytest.skip("needs root (to start Debian's dockerd) or a running Docker engine")
    out = tmp_path_factory.mktemp("compose")
    ensure_env_files()
    with docker_engine(out / "dockerd.log") as env:
        build_images(env, "auto")
        running = Stack(env, project="labeldp-test", gateway_port=free_port(), trainer_port=free_port(),
                        spark_ui_port=free_port())
        running.down(volumes=True)  # a previous interrupted run's
        try:
            running.up()
            yield running
        finally:
            save_logs(running, out)
            running.down(volumes=True)


@pytest.fixture(scope="module")
def keys(stack):
    from labeldp.benchmarks.parties import CONSUMER, Parties

    made = {"admin": stack.create_key("labels", "statistics-office", "admin"),
            "consumer": stack.create_key("labels", CONSUMER, "consumer"),
            "trainer": stack.create_key("features", CONSUMER, "admin")}
    return Parties(stack.labels_url, stack.trainer_url, made["admin"].secret, made["consumer"].secret,
                   made["trainer"].secret)


def _dataset(parties, epsilon_total: float) -> str:
    from labeldp.benchmarks.parties import CONSUMER

    with LabelsPartyClient(parties.labels_url, parties.owner_key, retries=8) as office:
        dataset = office.create_dataset(name=f"stream-{uuid.uuid4().hex[:6]}", label_kind="integer", min=0,
                                        max=20, epsilon_total=epsilon_total)
        office.upload_labels(dataset.id, [f"e{i}" for i in range(SIZE)], np.arange(SIZE) % 21)
        office.grant(dataset.id, CONSUMER, epsilon_total)
    return dataset.id


class Between:
    """Kills land between the streams' requests: the streams wait at a gate, and a kill waits for the requests in
    flight to be answered. A process killed between a charge's commit and the export of its signed head leaves
    ledger entries no exported head covers, which verify-audit reports — it cannot tell them from entries written
    outside the service (docs/design/audit.md). A kill in the middle of a release's computation is
    tests/labels_party/test_replicas.py's, after its head was exported. Requests sent while a replica is down
    still reach it through the gateway until its health check fails: those are refused connections, retried on the
    other replica by the gateway or, with the same Idempotency-Key, by the client."""

    def __init__(self) -> None:
        self._open, self._idle = threading.Event(), threading.Condition()
        self._open.set()
        self._in_flight = 0

    @contextlib.contextmanager
    def request(self):
        self._open.wait()
        with self._idle:
            self._in_flight += 1
        try:
            yield
        finally:
            with self._idle:
                self._in_flight -= 1
                self._idle.notify_all()

    @contextlib.contextmanager
    def pause(self):
        self._open.clear()
        with self._idle:
            assert self._idle.wait_for(lambda: self._in_flight == 0, timeout=300)
        time.sleep(1)  # the last answers' heads exported (right after their commits, before their answers)
        try:
            yield
        finally:
            self._open.set()


def _crash(stack: Stack, service: str) -> None:
    """SIGKILL to the container's main process from the host: a crash, which the restart policy answers (a
    ``docker kill`` is a manual stop that it does not)."""
    pid = subprocess.run(["docker", "inspect", "--format", "{{.State.Pid}}", stack.container(service)],
                         env=stack.env, capture_output=True, text=True, check=True).stdout.strip()
    os.kill(int(pid), 9)


def _restarts(stack: Stack, service: str) -> int:
    return int(subprocess.run(["docker", "inspect", "--format", "{{.RestartCount}}", stack.container(service)],
                              env=stack.env, capture_output=True, text=True, check=True).stdout.strip())


def test_replicas_killed_during_a_stream_of_releases_converge_and_charge_once(stack, keys):
    dataset_id = _dataset(keys, STREAMS * PER_STREAM * EPSILON)
    outcomes: dict[str, str] = {}  # Idempotency-Key -> release id, or "failed:<code>"
    progress = threading.Semaphore(0)
    between = Between()

    def stream(index: int) -> None:
        with LabelsPartyClient(keys.labels_url, keys.consumer_key, retries=10, backoff=0.5) as client:
            for number in range(PER_STREAM):
                key = f"stream{index}-{number}"
                with between.request():
                    try:
                        release = client.request_release(dataset_id, {"mechanism": "rr", "epsilon": EPSILON},
                                                         idempotency_key=key)
                        outcomes[key] = release.id
                    except ReleaseFailed as failed:  # charged before it was computed, then its replica died
                        outcomes[key] = f"failed:{failed.code}"
                progress.release()

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(STREAMS)]
    for thread in threads:
        thread.start()
    for _ in range(6):
        progress.acquire()
    restarts = _restarts(stack, "labels-a")
    with between.pause():
        _crash(stack, "labels-a")
    for _ in range(12):
        progress.acquire()
    with between.pause():
        subprocess.run(["docker", "kill", stack.container("labels-b")], env=stack.env, check=True,
                       capture_output=True)
    time.sleep(2)
    stack.compose("up", "-d", "--no-build", "labels-b")  # compose brings back what was stopped
    for thread in threads:
        thread.join(timeout=900)
    assert not any(thread.is_alive() for thread in threads)
    stack.wait_healthy(seconds=300)
    assert _restarts(stack, "labels-a") == restarts + 1  # the restart policy brought the crashed replica back

    assert len(outcomes) == STREAMS * PER_STREAM
    with LabelsPartyClient(keys.labels_url, keys.owner_key) as office:
        releases = office.list_releases(dataset_id)
        budget = office.budget(dataset_id)
    by_key = {release.idempotency_key: release for release in releases}
    assert len(releases) == len(by_key) == STREAMS * PER_STREAM  # one release per logical request, never two
    for key, outcome in outcomes.items():
        if outcome.startswith("failed:"):
            assert by_key[key].state == "failed" and outcome == "failed:release_failed"
        else:
            assert by_key[key].id == outcome and by_key[key].state == "available"
    # every release charged once, failed ones included: each example spent exactly the sum
    assert budget.epsilon_spent == pytest.approx(STREAMS * PER_STREAM * EPSILON, abs=1e-9)
    verified = stack.verify_audit()
    assert verified["valid"] is True, verified
    failed = sum(outcome.startswith("failed:") for outcome in outcomes.values())
    print(f"\n{len(outcomes)} releases: {len(outcomes) - failed} available, {failed} failed after their charge "
          f"(computing on a killed replica); spent {budget.epsilon_spent:g} = {len(outcomes)} x {EPSILON:g}")


def test_postgres_restarted_mid_run_the_services_reconnect(stack, keys):
    dataset_id = _dataset(keys, 10 * EPSILON)
    stack.compose("restart", "postgres")
    stack.wait_healthy(seconds=300)
    with LabelsPartyClient(keys.labels_url, keys.consumer_key, retries=0) as client:  # no retry hides a 5xx
        for number in range(8):
            release = client.request_release(dataset_id, {"mechanism": "rr", "epsilon": EPSILON},
                                             idempotency_key=f"after-restart-{number}")
            assert release.state == "available"
    answers = [httpx.get(f"{keys.labels_url}/readyz", timeout=10).status_code for _ in range(6)]
    assert answers == [200] * 6  # both replicas behind the gateway
    trainer = httpx.get(f"{keys.trainer_url}/v1/jobs", headers={"Authorization": f"Bearer {keys.trainer_key}"},
                        timeout=10)
    assert trainer.status_code == 200


def test_a_source_dataset_is_released_on_the_spark_cluster(stack, keys):
    import pandas as pd

    from labeldp.compose_stack import StackSources

    truth = pd.DataFrame({"example_id": [f"s{i}" for i in range(5_000)], "hours": np.arange(5_000) % 61})
    result = run_round(keys, StackSources(stack, "statistics-office"), truth, label="hours", maximum=60)
    execution = result.release.execution
    assert execution is not None and execution.master == "spark://spark-master:7077"
    assert execution.executors == 2  # one per worker: spark.cores.max 2, one core each, spread out
    assert execution.application_id in result.master_applications and result.alive_workers == 2
    assert result.release.state == "available" and result.num_examples == 5_000
    assert result.release.charged_epsilon == pytest.approx(SOURCE_EPSILON)


def test_a_trainer_job_boosts_its_trees_on_the_trainers_spark_cluster(stack, keys):
    """Issue 43: a job with ``"engine": "spark"`` on a table imported as Parquet files boosts on the trainer's own
    cluster (its master and two workers, apart from the labels party's): its driver reports the application and
    two executors, and its model agrees with the same job trained in the trainer's process on the same release
    (charged once): predictions within a tenth of their variance of each other's, and as close to the true labels."""
    import io

    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    from labeldp.benchmarks.parties import CONSUMER

    rng = np.random.default_rng(11)
    rows = 6_000
    x = rng.normal(size=(rows, 3))
    truth = np.clip(np.rint(10 + 3 * x[:, 0] - 2 * x[:, 1] + rng.normal(size=rows)), 0, 20)
    ids = [f"t{i}" for i in range(rows)]
    with LabelsPartyClient(keys.labels_url, keys.owner_key, retries=8) as office:
        dataset = office.create_dataset(name=f"cluster-{uuid.uuid4().hex[:6]}", label_kind="integer", min=0,
                                        max=20, epsilon_total=4)
        office.upload_labels(dataset.id, ids, truth)
        office.grant(dataset.id, CONSUMER, 4)
    frame = pd.DataFrame({"example_id": ids, **{f"x{j}": x[:, j] for j in range(3)}})
    parts = []
    for part in np.array_split(np.arange(rows), 3):
        buffer = io.BytesIO()
        pq.write_table(pa.Table.from_pandas(frame.iloc[part], preserve_index=False), buffer)
        parts.append(buffer.getvalue())
    table = f"impressions-{uuid.uuid4().hex[:6]}"
    assert stack.import_features(CONSUMER, table, parts)["num_examples"] == rows

    headers = {"Authorization": f"Bearer {keys.trainer_key}"}
    request = {"features": table, "api_key": keys.consumer_key, "dataset_id": dataset.id,
               "release": {"mechanism": "opt-unbiased", "epsilon": 3.0}, "numeric": ["x0", "x1", "x2"],
               "engine": "spark", "train": {"model": "gbdt", "gbdt": {"n_estimators": 60, "learning_rate": 0.2}}}

    def finished(job_id: str) -> dict:
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            job = httpx.get(f"{keys.trainer_url}/v1/jobs/{job_id}", headers=headers, timeout=30).json()
            if job["status"] in ("succeeded", "failed"):
                return job
            time.sleep(1)
        raise AssertionError(f"job {job_id} did not finish")

    def predictions(job_id: str) -> pd.Series:
        body = httpx.get(f"{keys.trainer_url}/v1/jobs/{job_id}/predictions", timeout=60,
                         headers={**headers, "Accept": "application/vnd.apache.parquet"}).content
        return pd.read_parquet(io.BytesIO(body)).set_index("example_id")["prediction"]

    started = time.monotonic()
    created = httpx.post(f"{keys.trainer_url}/v1/jobs", json=request, headers=headers, timeout=120)
    assert created.status_code == 202, created.text
    on_cluster = finished(created.json()["id"])
    assert on_cluster["status"] == "succeeded", on_cluster["error"]
    print(f"the trainer's cluster job: {on_cluster['device']} in {time.monotonic() - started:.0f} s "
          f"({on_cluster['seconds']:.0f} s in the job)", flush=True)
    assert "on Spark (app-" in on_cluster["device"] and ": 2 executors, 2 workers" in on_cluster["device"]
    local = httpx.post(f"{keys.trainer_url}/v1/jobs", headers=headers, timeout=120, json={
        **{k: v for k, v in request.items() if k != "release"}, "release_id": on_cluster["release"]["id"],
        "engine": "local"})
    assert local.status_code == 202, local.text
    in_process = finished(local.json()["id"])
    assert in_process["status"] == "succeeded", in_process["error"]
    with LabelsPartyClient(keys.labels_url, keys.owner_key, retries=8) as office:
        assert office.budget(dataset.id).epsilon_spent == pytest.approx(3.0)  # one release, charged once

    cluster, here = predictions(on_cluster["id"]), predictions(in_process["id"])
    here = here[cluster.index]
    agreement = float(np.mean((cluster - here) ** 2) / np.var(here))
    errors = [float(np.mean((p[ids] - truth) ** 2)) for p in (cluster, here)]
    print(f"agreement: mean squared difference {agreement:.3%} of the predictions' variance; MSE against the true "
          f"labels {errors[0]:.3f} (cluster), {errors[1]:.3f} (in process), variance {np.var(truth):.3f}", flush=True)
    # the same trees up to each worker's quantile sketch of its half, grown on noisy labels (measured: 5.5 % of
    # the variance apart, MSE against the truth 1.97 and 1.99 of a variance of 13.4; a later run 4.2 % apart
    # and 2.35 against 2.07: the two errors are compared in the labels' variance, as the local Spark test does —
    # 10 % of one error failed on an honest run, while a broken cluster model is worlds apart on both counts)
    assert agreement < 0.1 and abs(errors[0] - errors[1]) < 0.05 * np.var(truth), (agreement, errors)
    assert max(errors) < 0.25 * np.var(truth), errors
