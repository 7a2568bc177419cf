"""Typed httpx client for the labels-party API, used by the features party (and by the demo as the owner).

Releases are retried on connection errors and 5xx with the *same* Idempotency-Key, so a retry can never
produce a second draw of noisy labels or a second charge; a 429 or 503 with a short ``Retry-After`` (a release
quota, the service busy) is retried after it. 401/403/404/409 become specific exceptions.
"""

from __future__ import annotations

import io
import ssl
import time
import uuid
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import IO
from urllib.parse import quote

import httpx
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from shared import schemas
from shared.errors import ErrorCode, LabelDPError
from shared.estimates import MSEEstimate, unbiased_mse_estimate_from_document


class LabelDPWarning(UserWarning):
    """What a service says the user should know, shown by the SDK as a Python warning: a model not shown to be better
    than the constant predictor, a declared label range far wider than the labels."""


class LabelsPartyError(Exception):
    def __init__(self, status: int, code: str, message: str, body: dict | None = None):
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message, self.body = status, code, message, body or {}

    @property
    def safe_code(self) -> str:
        """The error code if it is one of the shared codes (safe to pass on), else a generic one."""
        return self.code if self.code in ErrorCode._value2member_map_ else "error"


class Unauthorized(LabelsPartyError):
    pass


class Forbidden(LabelsPartyError):
    pass


class NotFound(LabelsPartyError):
    """No such dataset, release or mechanism document *for this key* (the labels party answers the same whether
    the object does not exist or belongs to someone else)."""


class Conflict(LabelsPartyError):
    pass


class BudgetExceeded(Conflict):
    """This organization's allocation does not allow the request (its figures: :meth:`LabelsPartyClient.budget`)."""


class ReleaseFailed(LabelsPartyError):
    """A release that was charged but whose computation failed, also when sent again with its key (a source
    dataset's Spark job failing twice): it stays charged; only a new key would draw (and charge) again."""


IN_PROGRESS_POLL_SECONDS = 1.0  # how often a call waits again while another with its key is being computed
# A quota or capacity refusal (429, 503) says when to come back; a retried call waits that long if it is at most
# this (a CPU quota that refills in an hour is the caller's to report, not to sleep through).
RETRY_AFTER_MAX_SECONDS = 60.0


def _in_progress(response: httpx.Response) -> bool:
    if response.status_code != 409:
        return False
    try:
        return response.json()["error"]["code"] == "release_in_progress"
    except (ValueError, KeyError, TypeError):
        return False


def _retry_after(response: httpx.Response) -> float | None:
    """The seconds a 429 or 503 asks the caller to wait before sending the request again (None: not to)."""
    if response.status_code not in (429, 503):
        return None
    try:
        seconds = float(response.headers["retry-after"])
    except (KeyError, ValueError):
        return None
    return seconds if 0 <= seconds <= RETRY_AFTER_MAX_SECONDS else None


def _raise_for(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        body = response.json()
        code, message = body["error"]["code"], body["error"]["message"]
    except (ValueError, KeyError, TypeError):
        body, code, message = {}, "http_error", response.text[:200]
    cls = {401: Unauthorized, 403: Forbidden, 404: NotFound}.get(response.status_code, LabelsPartyError)
    if response.status_code == 409:
        cls = BudgetExceeded if code == "budget_exceeded" else Conflict
    raise cls(response.status_code, code, message, body)


def _segment(value: str) -> str:
    """One URL path segment: nothing in an id can add a path, a query or a fragment."""
    return quote(str(value), safe="")


def release_body(request: schemas.ReleaseRequest) -> dict:
    """A release request as sent: what it says (:meth:`~shared.schemas.ReleaseRequest.identity`: an opt-in such as
    ``allow_uninformative`` only when given), without unset options — a labels party older than a field, which
    forbids fields it does not know, accepts every request that does not use it."""
    return {name: value for name, value in request.identity().items() if value is not None}


def _scored_predictions(predictions: pd.Series | pd.DataFrame, holdout) -> tuple[pd.Series, pd.Series | None]:
    """Predictions (float) and, if known, which were held out of training (bool), both indexed by example id (str):
    from a predictions frame (``example_id`` column or index, ``prediction``, ``holdout``) or a Series and a mask."""
    if isinstance(predictions, pd.DataFrame):
        if "prediction" not in predictions.columns:
            raise LabelDPError("a predictions frame has a 'prediction' column (and 'example_id', 'holdout')",
                               code=ErrorCode.INVALID_INPUT)
        frame = predictions.set_index("example_id") if "example_id" in predictions.columns else predictions
        if holdout is None and "holdout" in frame.columns:
            holdout = frame["holdout"]
        predictions = frame["prediction"]
    index = predictions.index.astype(str)
    if index.has_duplicates:
        raise LabelDPError("predictions has duplicate example ids", code=ErrorCode.INVALID_INPUT)
    predicted = pd.Series(np.asarray(predictions, dtype=np.float64), index=index)
    if holdout is None:
        return predicted, None
    malformed = LabelDPError(f"holdout is booleans: a Series by example id, or one per prediction ({len(index)}) in "
                             "their order", code=ErrorCode.INVALID_INPUT)
    if isinstance(holdout, pd.Series):
        held = holdout.set_axis(holdout.index.astype(str))
    else:
        mask = np.asarray(holdout)
        if mask.shape != (len(index),):
            raise malformed
        held = pd.Series(mask, index=index)
    if held.dtype != bool or held.index.has_duplicates:
        raise malformed
    return predicted, held


def quantile_values(release: schemas.Release) -> dict[float, float]:
    """A quantile release's values by quantile (``description.values`` keys each quantile as its decimal text)."""
    return {float(q): float(v) for q, v in release.description["values"].items()}


class LabelsPartyClient:
    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = 300.0,
        retries: int = 4,
        backoff: float = 0.5,
        transport: httpx.BaseTransport | None = None,
        verify: bool | str = True,
    ):
        """``verify``: check the server's TLS certificate (the default) against the system CAs, or against the CA
        bundle at this path."""
        self._http = httpx.Client(
            base_url=base_url,
            timeout=timeout,
            transport=transport,
            verify=ssl.create_default_context(cafile=verify) if isinstance(verify, str) else verify,
            headers={"Authorization": f"Bearer {api_key}"},
        )
        self.retries, self.backoff, self._timeout = retries, backoff, timeout

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> LabelsPartyClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _request(self, method: str, url: str, *, retry: bool, **kwargs) -> httpx.Response:
        attempt, waiting_since = 0, None
        while True:
            try:
                response = self._http.request(method, url, **kwargs)
                if retry and _in_progress(response):
                    # Another request with this key is being computed (a retried call after a timeout): wait for
                    # its outcome, polling, for as long as a call may take — never a new draw, never a new charge.
                    waiting_since = waiting_since or time.monotonic()
                    if time.monotonic() - waiting_since < self._timeout:
                        time.sleep(IN_PROGRESS_POLL_SECONDS)
                        continue
                wait = _retry_after(response) if retry and attempt < self.retries else None
                if wait is not None:  # over a quota, or the service busy: nothing was charged; same key again
                    attempt += 1
                    time.sleep(wait)
                    continue
                if response.status_code < 500 or not retry or attempt >= self.retries:
                    _raise_for(response)
                    return response
            except httpx.TransportError:
                if not retry or attempt >= self.retries:
                    raise
            attempt += 1
            time.sleep(self.backoff * 2 ** (attempt - 1))

    # -- owner operations ----------------------------------------------------------------------------------------
    def create_dataset(self, **fields) -> schemas.Dataset:
        body = schemas.dataset_create.validate_python(fields).model_dump(exclude_none=True)
        return schemas.Dataset(**self._request("POST", "/v1/datasets", json=body, retry=False).json())

    def upload_labels(self, dataset_id: str, example_ids: Iterable, labels: Iterable) -> schemas.UploadResult:
        table = pa.table(
            {"example_id": pa.array([str(i) for i in example_ids]), "label": pa.array(labels, pa.float64())}
        )
        sink = io.BytesIO()
        pq.write_table(table, sink)
        response = self._request(
            "PUT",
            f"/v1/datasets/{_segment(dataset_id)}/labels",
            content=sink.getvalue(),
            headers={"Content-Type": "application/vnd.apache.parquet"},
            retry=True,
        )
        result = schemas.UploadResult(**response.json())
        for warning in result.warnings:  # the owner's: a declared range far wider than the labels' bulk
            warnings.warn(f"dataset {dataset_id}: {warning}", LabelDPWarning, stacklevel=2)
        return result

    def upload_frame(self, dataset_id: str, frame: pd.DataFrame, *, id_column: str = "example_id",
                     label_column: str = "label") -> schemas.UploadResult:
        """:meth:`upload_labels` from two columns of a frame (ids as strings, labels as numbers)."""
        missing = [c for c in (id_column, label_column) if c not in frame.columns]
        if missing:
            columns = ", ".join(map(str, frame.columns))
            raise LabelDPError(f"the frame has no column {missing[0]!r} (its columns: {columns})",
                               code=ErrorCode.INVALID_INPUT)
        return self.upload_labels(dataset_id, frame[id_column].astype(str), frame[label_column].to_numpy(np.float64))

    def grant(self, dataset_id: str, org: str, epsilon: float, delta: float = 0.0) -> schemas.Grant:
        """Let ``org`` release, spending at most ``epsilon`` (and ``delta``) of every example's budget."""
        body = {"org": org, "epsilon": epsilon, "delta": delta}
        return schemas.Grant(
            **self._request("POST", f"/v1/datasets/{_segment(dataset_id)}/grants", json=body, retry=True).json()
        )

    def audit(self, dataset_id: str | None = None) -> schemas.Audit:
        params = {"dataset": dataset_id} if dataset_id else None
        return schemas.Audit(**self._request("GET", "/v1/audit", params=params, retry=True).json())

    # -- consumer operations ----------------------------------------------------------------------------------
    def get_dataset(self, dataset_id: str) -> schemas.Dataset:
        return schemas.Dataset(**self._request("GET", f"/v1/datasets/{_segment(dataset_id)}", retry=True).json())

    def budget(self, dataset_id: str) -> schemas.Budget:
        return schemas.Budget(**self._request("GET", f"/v1/datasets/{_segment(dataset_id)}/budget", retry=True).json())

    def request_release(
        self, dataset_id: str, request: schemas.ReleaseRequest | dict, *, idempotency_key: str | None = None,
        wait_seconds: float = 3600.0, poll_seconds: float = 2.0,
    ) -> schemas.Release:
        """The release; a source dataset's release is a Spark job (202): polled until ``available`` (at most
        ``wait_seconds``). A job that failed is sent again once with the same key, which re-runs it with the same
        charge and the same noise; a second failure raises with the release's error."""
        body = request if isinstance(request, schemas.ReleaseRequest) else schemas.ReleaseRequest(**request)
        key = idempotency_key or uuid.uuid4().hex  # one key for every retry of this logical request

        def send() -> schemas.Release:
            return schemas.Release(**self._request(
                "POST",
                f"/v1/datasets/{_segment(dataset_id)}/releases",
                json=release_body(body),
                headers={"Idempotency-Key": key},
                retry=True,
            ).json())

        release, deadline, resent = send(), time.monotonic() + wait_seconds, False
        while release.state != "available":
            if release.state == "failed":
                if resent:
                    error = release.error or {}
                    raise ReleaseFailed(409, error.get("code", "release_failed"),
                                        f"release {release.id} failed: {error.get('message', '')}")
                release, resent = send(), True
                continue
            if time.monotonic() > deadline:
                raise TimeoutError(f"release {release.id} still {release.state} after {wait_seconds:g} s")
            time.sleep(poll_seconds)
            release = self.get_release(release.id)
        return release

    def check_release(self, dataset_id: str, request: schemas.CheckedRelease) -> schemas.ReleaseCheck:
        """The release's refusal, or the examples it would cover, as its request would get it now — nothing drawn
        or charged: what a client asking for several releases checks before the first. One per call, so that a
        check's body is no larger than its release's."""
        if isinstance(request, schemas.ReleaseRequest):
            field, body = "releases", release_body(request)
        else:
            field = "evaluations" if isinstance(request, schemas.EvaluationRequest) else "prior_releases"
            body = request.model_dump(exclude_none=True)
        checked = self._request("POST", f"/v1/datasets/{_segment(dataset_id)}/release-checks",
                                json={field: [body]}, retry=True).json()
        return schemas.ReleaseCheck(**checked[field][0])

    def request_prior_release(
        self, dataset_id: str, example_ids, priors, epsilon: float, *, idempotency_key: str | None = None
    ) -> schemas.Release:
        """RRWithPrior with one prior per example; the priors (n x K) travel as a CSV body: what it decodes to is
        what a release check of its shape counts (:class:`~shared.schemas.PriorReleaseShape`; a Parquet body's
        columns count their stored pages too), and its header has no footer limit (a Parquet footer of ~190 bytes a
        column passes the labels party's 512 KiB at ~2,750 classes)."""
        priors = np.asarray(priors, dtype=np.float64)
        columns = {"example_id": pa.array([str(i) for i in example_ids])}
        columns.update({f"p_{k}": pa.array(priors[:, k]) for k in range(priors.shape[1])})
        sink = io.BytesIO()
        pacsv.write_csv(pa.table(columns), sink)
        key = idempotency_key or uuid.uuid4().hex
        response = self._request(
            "POST",
            f"/v1/datasets/{_segment(dataset_id)}/prior-releases",
            params={"epsilon": epsilon},
            content=sink.getvalue(),
            retry=True,
            headers={"Content-Type": "text/csv", "Idempotency-Key": key},
        )
        return schemas.Release(**response.json())

    def request_group_release(
        self,
        dataset_id: str,
        example_ids,
        groups,
        mechanism: str,
        epsilon: float,
        prior_epsilon: float,
        *,
        idempotency_key: str | None = None,
    ) -> schemas.Release:
        """One private prior and randomizer per group (groups computed from features, e.g. k-means)."""
        sink = io.BytesIO()
        pq.write_table(
            pa.table(
                {"example_id": pa.array([str(i) for i in example_ids]), "group": pa.array([str(g) for g in groups])}
            ),
            sink,
        )
        headers = {
            "Content-Type": "application/vnd.apache.parquet",
            "Idempotency-Key": idempotency_key or uuid.uuid4().hex,
        }
        response = self._request(
            "POST",
            f"/v1/datasets/{_segment(dataset_id)}/group-releases",
            retry=True,
            params={"mechanism": mechanism, "epsilon": epsilon, "prior_epsilon": prior_epsilon},
            content=sink.getvalue(),
            headers=headers,
        )
        return schemas.Release(**response.json())

    def request_central_training(self, dataset_id: str, example_ids, features, epsilon: float, *,
                                 idempotency_key: str | None = None, **options) -> schemas.Release:
        """LabelDP-Pro at the labels party on these features (if the dataset's owner enabled it); the trained
        parameters are in the release's mechanism document (``shared.models.params_from_lists``)."""
        body = schemas.CentralTrainingRequest(epsilon=epsilon, example_ids=[str(i) for i in example_ids],
                                              features=np.asarray(features, dtype=np.float64).tolist(), **options)
        response = self._request("POST", f"/v1/datasets/{_segment(dataset_id)}/central-trainings",
                                 json=body.model_dump(), retry=True,
                                 headers={"Idempotency-Key": idempotency_key or uuid.uuid4().hex})
        return schemas.Release(**response.json())

    def request_pate(self, dataset_id: str, example_ids, features, query_ids, query_features, epsilon: float, *,
                     idempotency_key: str | None = None, **options) -> schemas.Release:
        """PATE (``pate-fm``) at the labels party (if the dataset's owner enabled central training): teachers on
        ``features`` of the labelled ``example_ids``, their noisy votes labelling the ``query_ids`` rows —
        :meth:`download_labels` of the release reads them (``example_id`` is the query's id)."""
        body = schemas.PateRequest(epsilon=epsilon, example_ids=[str(i) for i in example_ids],
                                   features=np.asarray(features, dtype=np.float64).tolist(),
                                   query_ids=[str(i) for i in query_ids],
                                   query_features=np.asarray(query_features, dtype=np.float64).tolist(), **options)
        response = self._request("POST", f"/v1/datasets/{_segment(dataset_id)}/pate-releases",
                                 json=body.model_dump(), retry=True,
                                 headers={"Idempotency-Key": idempotency_key or uuid.uuid4().hex})
        return schemas.Release(**response.json())

    def request_quantiles(self, dataset_id: str, quantiles: Iterable[float], epsilon: float, *,
                          example_ids: Iterable | None = None, candidates: str = "support",
                          method: str = "exponential", idempotency_key: str | None = None) -> schemas.Release:
        """DP quantiles of the dataset's labels (of ``example_ids``' labels, else all of them) on its declared
        domain, ε charged to every covered example; :func:`quantile_values` reads them from the release.
        ``candidates="log", method="above-threshold"`` for a high quantile of heavy-tailed labels."""
        body = schemas.QuantilesRequest(quantiles=[float(q) for q in quantiles], epsilon=epsilon,
                                        example_ids=None if example_ids is None else [str(i) for i in example_ids],
                                        candidates=candidates, method=method)
        response = self._request("POST", f"/v1/datasets/{_segment(dataset_id)}/quantiles",
                                 json=body.model_dump(exclude_none=True), retry=True,
                                 headers={"Idempotency-Key": idempotency_key or uuid.uuid4().hex})
        return schemas.Release(**response.json())

    def request_evaluation(self, dataset_id: str, metric: str, example_ids: Iterable, epsilon: float, *,
                           predictions: Iterable[float] | None = None, clip: float | None = None,
                           idempotency_key: str | None = None) -> schemas.Release:
        """A private evaluation (``mse``, ``poisson``, ``accuracy`` of ``predictions``, one per example id) or the
        labels' private mean (``mean``, no predictions), charged ε on those examples; the value, its noise scale
        and 95 % interval are in the release's ``description``."""
        body = schemas.EvaluationRequest(
            metric=metric, epsilon=epsilon, example_ids=[str(i) for i in example_ids],
            **({"predictions": [float(p) for p in predictions]} if predictions is not None else {}),
            **({"clip": clip} if clip is not None else {}))
        response = self._request("POST", f"/v1/datasets/{_segment(dataset_id)}/evaluations",
                                 json=body.model_dump(exclude_none=True), retry=True,
                                 headers={"Idempotency-Key": idempotency_key or uuid.uuid4().hex})
        return schemas.Release(**response.json())

    def get_release(self, release_id: str) -> schemas.Release:
        return schemas.Release(**self._request("GET", f"/v1/releases/{_segment(release_id)}", retry=True).json())

    def mechanism_document(self, mechanism_hash: str) -> dict:
        """A release's full public description (``release.mechanism_hash``): output values, exact probabilities,
        the noisy prior, model parameters."""
        return self._request("GET", f"/v1/mechanisms/{_segment(mechanism_hash)}", retry=True).json()

    def list_releases(self, dataset_id: str) -> list[schemas.Release]:
        return [
            schemas.Release(**r)
            for r in self._request("GET", f"/v1/datasets/{_segment(dataset_id)}/releases", retry=True).json()
        ]

    def download_frame(self, release_id: str) -> pd.DataFrame:
        """:meth:`download_labels` as a pandas frame: ``example_id`` and ``label`` (or ``in_class_k`` columns)."""
        return self.download_labels(release_id).to_pandas()

    def estimate_test_mse(self, release_id: str, predictions: pd.Series | pd.DataFrame, *, holdout=None,
                          level: float = 0.95) -> MSEEstimate:
        """The unbiased estimate of the true-label MSE of a model's predictions on the examples of a release by an
        unbiased mechanism, with its confidence interval at ``level`` (widened by the estimate's ``bias_bound``
        and ``rounding_bound``: :class:`~shared.estimates.MSEEstimate`); from the release's privatized labels, its
        mechanism document and its dataset's domain only (:mod:`shared.estimates`), so nothing more is charged.

        ``predictions``: a job's predictions frame (``TrainerClient.predictions``: ``example_id``, ``prediction``,
        ``holdout``), or a Series of predictions indexed by example id (then ``holdout``, optional, is a boolean
        Series indexed by example id or a mask in the order of ``predictions``). Every released example needs a
        prediction (others are ignored) and, where ``holdout`` is known, must have been held out of training: an
        example the model trained on is refused (``not_held_out``) — its error is not a test error.

        Unbiased for a model fixed before these labels were looked at: choosing among many models by their
        estimates on the same release biases the chosen one's estimate downward (adaptive reuse of a holdout; see
        :mod:`shared.estimates`)."""
        predicted, held = _scored_predictions(predictions, holdout)
        release = self.get_release(release_id)
        if release.mechanism_hash is None:
            raise LabelDPError(f"release {release_id} is {release.state}: no mechanism document yet",
                               code=ErrorCode.RELEASE_NOT_READY)
        document = self.mechanism_document(release.mechanism_hash)
        domain = self.get_dataset(release.dataset_id).domain
        released = self.download_frame(release_id)
        if "label" not in released.columns:
            raise LabelDPError(f"release {release_id} ({release.mechanism}) releases no label per example",
                               code=ErrorCode.MECHANISM_NOT_ESTIMABLE)
        ids = released["example_id"]
        missing = ~ids.isin(predicted.index)
        if missing.any():
            raise LabelDPError(f"{int(missing.sum())} of the release's {len(released)} examples have no prediction, "
                               f"e.g. {ids[missing].iloc[0]!r}", code=ErrorCode.INVALID_INPUT)
        if held is not None:
            unknown = ~ids.isin(held.index)
            if unknown.any():
                raise LabelDPError(f"holdout does not say whether {int(unknown.sum())} of the release's examples were "
                                   f"held out, e.g. {ids[unknown].iloc[0]!r}", code=ErrorCode.INVALID_INPUT)
            trained = ~held[ids].to_numpy()
            if trained.any():
                raise LabelDPError(f"{int(trained.sum())} of the release's {len(released)} examples were trained on "
                                   f"(holdout false), e.g. {ids[trained].iloc[0]!r}: the estimate is of the error on "
                                   "examples the model did not see", code=ErrorCode.NOT_HELD_OUT)
        return unbiased_mse_estimate_from_document(predicted[ids].to_numpy(), released["label"].to_numpy(),
                                                   document, level=level, domain=domain)

    def download_labels(self, release_id: str) -> pa.Table:
        """The privatized labels as an Arrow table (example_id, label | in_class_k...), streamed as Parquet."""
        buffer = io.BytesIO()
        self._stream_labels(release_id, buffer)
        return pq.read_table(io.BytesIO(buffer.getvalue()))

    def download_labels_to(self, release_id: str, path: Path) -> Path:
        """The privatized labels streamed to a Parquet file at ``path`` (memory: a chunk, whatever their number)."""
        with open(path, "wb") as handle:
            self._stream_labels(release_id, handle)
        return path

    def _stream_labels(self, release_id: str, sink: IO[bytes]) -> None:
        """The release's Parquet labels written to ``sink`` (rewound and truncated for each retry)."""
        attempt = 0
        while True:
            sink.seek(0)
            sink.truncate()
            try:
                with self._http.stream(
                    "GET",
                    f"/v1/releases/{_segment(release_id)}/labels",
                    headers={"Accept": "application/vnd.apache.parquet"},
                ) as response:
                    if response.status_code >= 400:
                        response.read()
                        _raise_for(response)
                    for chunk in response.iter_bytes():
                        sink.write(chunk)
                return
            except (httpx.TransportError, LabelsPartyError) as err:
                if isinstance(err, LabelsPartyError) and err.status < 500 or attempt >= self.retries:
                    raise
                attempt += 1
                time.sleep(self.backoff * 2 ** (attempt - 1))
