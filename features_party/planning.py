"""Planning a job: everything checked before anything is asked of the labels party (its features table and columns,
example ids or split, options, its size and the rows it would train on, the labels party and the dataset's label kind
against the loss, mechanism and protocol), so a job that cannot run is a 4xx and spends nothing.

A job is planned when it is created, from the client's request, and again by every attempt and resume, from the
request its record keeps (``stored=True``): the planned one, whose ``release.example_ids`` name what the first plan
asked for (:func:`_naming_ids`) and whose id list split names the version the first plan read (its ``sha256``), so
every attempt asks the labels party for the same release — or, the list replaced, for nothing (``id_list_changed``)."""

from __future__ import annotations

import math
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import httpx
import numpy as np
import pandas as pd
import pyarrow.parquet as pq
from sqlalchemy import select
from sqlalchemy.orm import Session

from features_party import db, id_lists, joined, parts, schemas
from features_party.client import LabelsPartyClient, LabelsPartyError
from features_party.context import TrainerContext
from features_party.feature_datasets import is_dataset
from features_party.features import Preprocessor, check_present, table_bytes
from features_party.learn import gbdt, losses, spark_trees
from features_party.learn.train import TrainConfig
from features_party.parts import AutoPlan
from features_party.settings import TrainerSettings
from shared import models
from shared import schemas as shared_schemas
from shared.errors import ErrorCode, LabelDPError
from shared.service.storage_quota import BLOCK


def not_found(what: str) -> LabelDPError:
    return LabelDPError(f"no such {what} for this key", code=ErrorCode.NOT_FOUND)


def feature_row(session: Session, org_id: int, name: str) -> db.FeatureTable:
    row = session.scalar(select(db.FeatureTable).where(db.FeatureTable.org_id == org_id,
                                                       db.FeatureTable.name == name))
    if row is None:
        raise not_found("features table")
    return row


def load_frame(file: str, columns: Sequence[str]) -> pd.DataFrame:
    """The features table's ``columns`` (``example_id`` always), indexed by example id: a job reads what it trains
    on, never the whole table (issue 40's eleventh review: a job on a table of 120,000 columns read them all)."""
    wanted = ["example_id", *dict.fromkeys(c for c in columns if c != "example_id")]
    # pd.read_parquet's frame, each column converted as Arrow's is freed and kept in a block of its own (no
    # consolidated copy of all of them)
    frame = pq.read_table(file, columns=wanted).to_pandas(split_blocks=True, self_destruct=True)
    return frame.set_index("example_id", drop=False)


def check_columns(file: str, numeric: Sequence[str], categorical: Sequence[str]) -> None:
    """The job's feature columns are in the table (from its schema, before any row is read)."""
    check_present(pq.read_schema(file).names, numeric, categorical)


Config = TrainConfig | gbdt.GbdtConfig
ESTIMATE_KEY = "estimate"  # the Idempotency-Key suffix of a job's estimate release


@dataclass(frozen=True)
class EstimatePlan:
    """A job's estimate rows (:mod:`features_party.parts`): ``fraction`` of its training rows by the public rule with
    ``seed``; their labels from the job's own release (``mechanism`` None: it is unbiased, or an existing release
    whose document decides) or from a release of their own by ``mechanism`` at the job's ε."""

    fraction: float
    seed: int
    mechanism: str | None


@dataclass(frozen=True)
class JobPlan:
    """Everything a job needs, checked: what runs in the background can only fail for reasons nobody could have
    checked up front (the labels party going away, a training divergence)."""

    request: schemas.JobRequest
    labels_party: str
    url: str
    features_file: str
    configs: dict[str, Config]  # each learner's options: one learner, or an auto job's two
    num_classes: int | None
    existing_release: shared_schemas.Release | None = None  # to train on instead of requesting one
    # the features table's ids its split holds out: never trained on, marked in the predictions
    held_out: pd.Index = field(default_factory=lambda: pd.Index([], dtype=object))
    estimate: EstimatePlan | None = None
    auto: AutoPlan | None = None
    # what its outputs store at most: a prediction a row of its features table, and its models (every fit's)
    output_bytes: int = 0

    @property
    def columns(self) -> list[str]:
        """The feature columns the job reads (its numeric, then its categorical)."""
        return [*self.request.numeric, *self.request.categorical]

    @property
    def config(self) -> Config:
        """The learner's options of a job with one learner (every fixed-mechanism job)."""
        (config,) = self.configs.values()
        return config

    @property
    def streamed(self) -> bool:
        """Whether the job trains from disk: its table was imported as Parquet files."""
        return is_dataset(self.features_file)

    @property
    def loss(self) -> str:
        return next(iter(self.configs.values())).loss

    def training_ids(self, frame: pd.DataFrame) -> pd.Index:
        """The ids the job may train on, its estimate rows included: its release's ``example_ids`` (as planned),
        else its features table's, less those its split holds out."""
        release = self.request.release
        ids = pd.Index(release.example_ids) if release is not None and release.example_ids else frame.index
        return ids[~ids.isin(self.held_out)]

    def estimate_ids(self, ids: pd.Index) -> pd.Index:
        if self.estimate is None:
            return ids[:0]
        return ids[parts.estimate_mask(ids.astype(str), self.estimate.fraction, self.estimate.seed)]

    def releases(self) -> list[tuple[str, shared_schemas.ReleaseRequest]]:
        """What a fixed-mechanism job asks for before it trains, in order, as (Idempotency-Key suffix, request):
        its release ("": the job id is the key) — less its estimate rows when those have a release of their own —
        then that estimate release. An lp-mst job asks for its stages as it trains; an auto job for its parts."""
        release, estimate = self.request.release, self.estimate
        if self.existing_release is not None or not isinstance(release, shared_schemas.ReleaseRequest):
            return []
        out: list[tuple[str, shared_schemas.ReleaseRequest]] = []
        separate = estimate is not None and estimate.mechanism is not None and release.example_ids is not None
        held = self.estimate_ids(pd.Index(release.example_ids)) if separate else pd.Index([])
        if self.request.protocol == "single":
            ids = release.example_ids
            if ids is not None and separate:
                kept = set(held)
                ids = [i for i in ids if i not in kept]
            out.append(("", release.model_copy(update={"example_ids": ids})))
        if separate and len(held):
            assert estimate is not None and estimate.mechanism is not None
            out.append((ESTIMATE_KEY, shared_schemas.ReleaseRequest(
                mechanism=estimate.mechanism, epsilon=release.epsilon, example_ids=held.astype(str).tolist())))
        return out


def labels_party_client(ctx: TrainerContext, url: str, api_key: str) -> LabelsPartyClient:
    settings = ctx.settings
    return LabelsPartyClient(url, api_key, timeout=settings.upstream_timeout_seconds,
                             retries=settings.upstream_retries, backoff=0.5,
                             verify=settings.upstream_ca_bundle or True)


def upstream_error(err: Exception, party: str) -> LabelDPError:
    """The trainer's own answer for a labels-party failure: never the upstream body, at most its error code (a
    member of the shared code enum)."""
    if isinstance(err, httpx.TransportError):
        return LabelDPError(f"labels party {party!r} is unreachable", code=ErrorCode.LABELS_PARTY_UNREACHABLE)
    if not isinstance(err, LabelsPartyError):
        return LabelDPError(f"labels party {party!r} failed", code=ErrorCode.LABELS_PARTY_FAILED)
    if err.status in (401, 403):
        return LabelDPError(f"labels party {party!r} refused the api_key for this",
                            code=ErrorCode.LABELS_PARTY_FORBIDDEN)
    if err.status == 404:
        return LabelDPError(f"labels party {party!r} has no such dataset or release for this api_key",
                            code=ErrorCode.LABELS_PARTY_NOT_FOUND)
    if err.code == "budget_exceeded":
        return LabelDPError(f"labels party {party!r}: the covered examples' budget is exceeded",
                            code=ErrorCode.LABELS_PARTY_BUDGET_EXCEEDED)
    if err.code == "unknown_example_ids":
        return LabelDPError(f"labels party {party!r} has no label for some of the example ids the job would train "
                            "on (a job without release.example_ids asks for every id of its features table); "
                            "nothing was spent", code=ErrorCode.LABELS_PARTY_REFUSED)
    if 400 <= err.status < 500:
        return LabelDPError(f"labels party {party!r} refused the request ({err.safe_code})",
                            code=ErrorCode.LABELS_PARTY_REFUSED)
    return LabelDPError(f"labels party {party!r} failed ({err.status})", code=ErrorCode.LABELS_PARTY_FAILED)


def _invalid(message: str) -> LabelDPError:
    return LabelDPError(message, code=ErrorCode.INVALID_JOB)


def plan_job(ctx: TrainerContext, org_id: int, request: schemas.JobRequest, *, stored: bool = False) -> JobPlan:
    """The job of organization ``org_id`` checked and sized: what can be refused on the trainer's own information
    (options, the features table, the example ids, the split, the size, the rows to train on) is refused before the
    labels party is asked anything; then the dataset (a read) decides the loss, the exact size and the ids to
    request. ``stored``: the request a job's record keeps (planned before: its ids may come with its split)."""
    auto = _check_options(request, stored)
    learners = _learners(request.train, auto)
    ctx.settings.labels_party_url(request.labels_party)  # a party this trainer knows (else 400), before any read
    with ctx.sessions() as session, session.begin():
        table = feature_row(session, org_id, request.features)
        features_file, table_rows = table.file, table.num_examples
    if is_dataset(features_file):
        return _plan_streamed(ctx, org_id, request, learners, features_file, table_rows, stored=stored)
    if request.engine != "local":
        raise _invalid("engine 'spark' trains on a features table imported as Parquet files (labeldp features "
                       "import-features); this table was uploaded: use engine 'local'")
    check_columns(features_file, request.numeric, request.categorical)
    columns = [*request.numeric, *request.categorical]
    with ctx.table_reads.held(table_bytes(features_file, columns), "reading the job's columns of its features table",
                              ErrorCode.JOB_TOO_LARGE):
        return _plan(ctx, org_id, request, auto, learners, features_file, load_frame(features_file, columns),
                     stored=stored)


def _plan(ctx: TrainerContext, org_id: int, request: schemas.JobRequest, auto: bool, learners: tuple[str, ...],
          features_file: str, frame: pd.DataFrame, *, stored: bool) -> JobPlan:
    """:func:`plan_job` once its columns of the table are read (``frame``)."""
    party, url = ctx.settings.labels_party_url(request.labels_party)
    Preprocessor.check(frame, request.numeric, request.categorical)
    _check_model(request, learners, auto)
    # 404: no such id list; 409: not the version the split pins. The request keeps the version read (its sha256).
    mask, split = id_lists.held_out(ctx, org_id, request.split, frame.index, stored=stored)
    held_out, request = frame.index[mask], request.model_copy(update={"split": split})
    rows = _rows_to_train(frame, request, held_out, ctx.settings.min_train_examples)
    # embeddings sized by the distinct values in the features table: an upper bound of what its training rows have
    vocab_sizes = tuple(int(frame[c].astype(str).nunique()) + 1 for c in request.categorical)
    fits = _fits(request, auto)  # a lower bound before the dataset is read
    _check_size(ctx.settings, request, learners, vocab_sizes, rows, output_dim=request.num_classes or 1, fits=fits)
    _check_mlp_memory(ctx.settings, request, learners, vocab_sizes, rows, output_dim=request.num_classes or 1,
                      fits=fits)
    dataset, existing = _dataset_and_release(ctx, party, url, request)
    if existing is not None:
        mechanism, rows = existing.mechanism, min(rows, existing.num_examples)
    else:
        assert request.release is not None  # exactly one of release and release_id (checked above): no release_id
        mechanism = request.release.mechanism
    loss, num_classes = _loss_for(request, mechanism, dataset)
    if "gbdt" in learners and loss not in gbdt.OBJECTIVES:
        raise _invalid(f"model gbdt has no {loss!r} loss (subset and ALIBI releases train the MLP only); use "
                       f"model mlp, or a mechanism whose loss is one of {', '.join(gbdt.OBJECTIVES)}")
    output_dim = losses.output_dim(loss, num_classes)
    _check_size(ctx.settings, request, learners, vocab_sizes, rows, output_dim=output_dim, fits=fits)
    _check_mlp_memory(ctx.settings, request, learners, vocab_sizes, rows, output_dim=output_dim, fits=fits)
    for learner in learners:
        _check_outputs(ctx.settings, request, learner, len(frame), rows, output_dim, vocab_sizes, fits=fits)
    configs = {learner: _config(request.train, learner, loss) for learner in learners}
    request = _naming_ids(request, frame, held_out, dataset)
    classes = dataset.label_kind == "classes"
    plan = JobPlan(request, party, url, features_file, configs, num_classes, existing, held_out,
                   _estimate_plan(request, existing, dataset, classes),
                   output_bytes=_output_bytes(request, learners, vocab_sizes, len(frame), rows, output_dim, fits,
                                              features_file))
    if auto:
        plan = _auto_plan(plan, dataset, frame, ctx.settings.min_train_examples)
        if not stored:  # created: what the labels party would refuse, before the first part is charged
            with labels_party_client(ctx, url, request.api_key) as client:
                plan = _checked_auto(plan, frame, client)
    elif request.protocol == "lp-mst" and not stored and existing is None:
        with labels_party_client(ctx, url, request.api_key) as client:
            _checked_stages(plan, frame, client)
    _check_training_rows(plan, frame, ctx.settings.min_train_examples)
    return plan


def _plan_streamed(ctx: TrainerContext, org_id: int, request: schemas.JobRequest, learners: tuple[str, ...],
                   features_file: str, table_rows: int, *, stored: bool) -> JobPlan:
    """:func:`plan_job` for a table imported as Parquet files, which trains from disk
    (:mod:`features_party.streamed_jobs`): from the table's schema and DuckDB's count of its categorical levels,
    never its rows in memory; sized on every row of the table."""
    refused = _streamed_refusal(request)
    if refused is not None:
        raise _invalid(refused)
    party, url = ctx.settings.labels_party_url(request.labels_party)
    _check_model(request, learners, auto=False)
    with tempfile.TemporaryDirectory(dir=ctx.scratch.spools) as work:
        sizes = _streamed_levels(Path(features_file), request, ctx.settings.table_read_budget_bytes, Path(work))
    if isinstance(request.split, schemas.HoldoutIds):  # 404 no such list, 409 not the version the split pins
        _file, sha256 = id_lists.pinned_file(ctx, org_id, request.split, stored=stored)
        request = request.model_copy(update={"split": request.split.model_copy(update={"sha256": sha256})})
    _check_size(ctx.settings, request, learners, sizes, table_rows, output_dim=request.num_classes or 1, fits=1)
    dataset, existing = _dataset_and_release(ctx, party, url, request)
    mechanism = existing.mechanism if existing is not None else request.release.mechanism  # type: ignore[union-attr]
    loss, num_classes = _loss_for(request, mechanism, dataset)
    if loss not in gbdt.OBJECTIVES:
        raise _invalid(NOT_YET.format(what=f"{mechanism} releases (their {loss!r} loss)"))
    output_dim = losses.output_dim(loss, num_classes)
    _check_size(ctx.settings, request, learners, sizes, table_rows, output_dim=output_dim, fits=1)
    for learner in learners:
        _check_streamed_memory(ctx.settings, request, learner, sizes, table_rows, output_dim)
    _check_join_memory(ctx.settings, existing.num_examples if existing is not None else dataset.num_examples)
    if request.engine == "spark":
        _check_spark(ctx.settings, request, learners, loss, table_rows)
    configs = {learner: _config(request.train, learner, loss) for learner in learners}
    # estimate rows from the job's own release only (a release of their own would name them: not at this size)
    estimate = _estimate_plan(request, existing, dataset, dataset.label_kind == "classes")
    return JobPlan(request, party, url, features_file, configs, num_classes, existing,
                   estimate=estimate if estimate is not None and estimate.mechanism is None else None,
                   output_bytes=_output_bytes(request, learners, sizes, table_rows, table_rows, output_dim, 1,
                                              features_file))


NOT_YET = "jobs on a features table imported as Parquet files (trained from disk) do not take {what} yet"
# What a streamed tree job holds per training row besides its model and histograms: XGBoost keeps each row's label,
# gradient, hessian and cached prediction in memory (float32 each), its row partition's indices and its quantile
# sketch's weights, and each round's metric its predictions and labels; its pages are on disk. Measured at 9·10⁷
# training rows (the 10⁸-row bench): 4.77 GB anonymous, ~47 bytes a row beyond the process's own half gigabyte
# (24, the count of the arrays alone, was half of it).
TREE_ROW_BYTES = 48


def _streamed_refusal(request: schemas.JobRequest) -> str | None:
    """What a job trained from disk cannot do (:mod:`features_party.streamed_jobs`), as its 400's message."""
    release = request.release
    if isinstance(release, schemas.AutoRelease):
        return NOT_YET.format(what="mechanism 'auto'") + ": give a fixed mechanism"
    if request.protocol != "single":
        return NOT_YET.format(what="protocol 'lp-mst'")
    if release is not None and release.example_ids is not None:
        return NOT_YET.format(what="release.example_ids") + ": hold rows out with split"
    return None


# DuckDB's memory a streamed job's join needs a released label: the 10⁸-row bench's join ran out of 488 MiB (after
# the job's release was charged) and joined within 3 GiB; 10⁷ labels joined within 488 MiB.
JOIN_LABEL_BYTES = 16


def _check_join_memory(settings: TrainerSettings, labels: int) -> None:
    """A job whose join would run out of DuckDB's memory (``table_read_budget_bytes``) refused before anything is
    asked of the labels party (its release covers ``labels`` examples: the whole dataset, or the existing one's)."""
    needed = JOIN_LABEL_BYTES * labels
    if needed > settings.table_read_budget_bytes:
        raise LabelDPError(f"joining the job's {labels:,} released labels with its table may take {needed:.3g} bytes "
                           f"of memory, over this trainer's {settings.table_read_budget_bytes:.3g} "
                           "(table_read_budget_bytes)", code=ErrorCode.JOB_TOO_LARGE)


def _check_spark(settings: TrainerSettings, request: schemas.JobRequest, learners: tuple[str, ...], loss: str,
                 rows: int) -> None:
    """A job on the trainer's Spark cluster (:mod:`features_party.learn.spark_trees`): trees with a loss the
    cluster's estimator takes, on a trainer that has a cluster, whose executors each hold at most
    ``spark_worker_memory_bytes`` of its rows (a float32 a feature, and :data:`TREE_ROW_BYTES`, a row)."""
    if settings.spark_master is None:
        raise _invalid("this trainer has no Spark cluster (its spark_master setting): use engine 'local'")
    if learners != ("gbdt",):
        raise _invalid("engine 'spark' boosts trees (train.model 'gbdt'); the MLP trains in the trainer's process, "
                       "on its GPU when it has one: use engine 'local'")
    if loss not in spark_trees.LOSSES:
        raise _invalid(f"engine 'spark' trains the squared and cross-entropy losses, not {loss!r} (its gradient is "
                       "the trainer's own function): use engine 'local'")
    per_worker = math.ceil(rows / settings.spark_workers) * (4 * (len(request.numeric) + len(request.categorical))
                                                            + TREE_ROW_BYTES)
    if per_worker > settings.spark_worker_memory_bytes:
        limit = settings.spark_worker_memory_bytes
        raise LabelDPError(f"each of the job's {settings.spark_workers} Spark workers may hold {per_worker:.3g} bytes "
                           f"of its {rows:,} rows, over this trainer's limit of {limit:.3g} "
                           "(spark_worker_memory_bytes)", code=ErrorCode.JOB_TOO_LARGE)


def _streamed_levels(features: Path, request: schemas.JobRequest, memory_bytes: int, work: Path) -> tuple[int, ...]:
    """The job's columns checked against the table's schema, and each categorical column's distinct values in the
    whole table plus one (the unseen level): an upper bound of what its training rows have, counted by DuckDB."""
    files = joined.files_literal(joined.parquet_files(features))
    with joined.connection(work, memory_bytes, 1) as con:
        con.execute(f"CREATE VIEW features AS SELECT * FROM read_parquet({files})")
        joined.check_columns(con, request.numeric, request.categorical)
        if not request.categorical:
            return ()
        counts = ", ".join(f'count(DISTINCT "{c}")' for c in request.categorical)
        row = con.execute(f"SELECT {counts} FROM features").fetchone()
    assert row is not None  # (an aggregate's one row)
    return tuple(int(count) + 1 for count in row)


def _check_streamed_memory(settings: TrainerSettings, request: schemas.JobRequest, learner: str,
                           vocab_sizes: tuple[int, ...], rows: int, output_dim: int) -> None:
    """What a job trained from disk holds, against the in-memory limits: the MLP its parameters and activations and
    two row groups (the one it trains on, the next being read); the trees their model, histograms and
    :data:`TREE_ROW_BYTES` a row."""
    if learner == "mlp":
        options = request.train
        spec = models.ModelSpec(len(request.numeric), vocab_sizes, options.embed_dim, tuple(options.hidden),
                                output_dim)
        memory = mlp_memory(spec, options.batch_size, 2 * joined.ROW_GROUP_ROWS)
        total, limit, setting, what = memory.total, settings.max_mlp_bytes, "max_mlp_bytes", memory.describe()
    else:
        trees = request.train.gbdt or schemas.GbdtOptions()
        held = gbdt.memory(trees.n_estimators, trees.max_depth, max(output_dim, 1), rows, len(request.numeric),
                           vocab_sizes)
        total, limit, setting = held.model + held.histograms + TREE_ROW_BYTES * rows, settings.max_tree_bytes, \
            "max_tree_bytes"
        what = (f"{total:.3g} bytes = model {held.model:.3g} + histograms {held.histograms:.3g} + "
                f"{TREE_ROW_BYTES} bytes × {rows:,} rows")
    if total > limit:
        raise LabelDPError(f"the job may take {what}, over this trainer's limit of {limit:.3g} ({setting})",
                           code=ErrorCode.JOB_TOO_LARGE)


def _dataset_and_release(ctx: TrainerContext, party: str, url: str, request: schemas.JobRequest
                         ) -> tuple[shared_schemas.Dataset, shared_schemas.Release | None]:
    """The job's dataset and the existing release it names (checked: of that dataset, with labels), read from the
    labels party."""
    with labels_party_client(ctx, url, request.api_key) as client:
        try:
            dataset = client.get_dataset(request.dataset_id)
            existing = client.get_release(request.release_id) if request.release_id else None
        except (LabelsPartyError, httpx.HTTPError) as err:
            raise upstream_error(err, party) from None
    if existing is not None:
        _check_existing(existing, request.dataset_id)
    return dataset, existing


def _check_options(request: schemas.JobRequest, stored: bool) -> bool:
    """The request's options that exclude each other refused; whether it is an ``auto`` job."""
    if (request.release is None) == (request.release_id is None):
        raise _invalid("give either release (to request one) or release_id (to train on an existing one)")
    if not stored and request.split is not None and request.release is not None \
            and request.release.example_ids is not None:
        raise _invalid("give either split (the rows to hold out) or release.example_ids (the rows to train on)")
    if request.protocol == "lp-mst" and request.release is None:
        raise _invalid("lp-mst requests its own releases: give release, not release_id")
    auto = isinstance(request.release, schemas.AutoRelease)
    if auto and request.protocol != "single":
        raise _invalid("an auto job chooses among protocols itself (its candidates include lp-2st): give protocol "
                       "'single'")
    return auto


def _check_existing(existing, dataset_id: str) -> None:
    """An existing release a job trains on: of the job's dataset, and one that publishes labels."""
    if existing.dataset_id != dataset_id:
        raise _invalid(f"release {existing.id} is not a release of dataset {dataset_id}")
    if existing.mechanism in shared_schemas.LABELLESS_RELEASES:
        raise _invalid(f"release {existing.id} ({existing.mechanism}) publishes no labels to train on")


def _learners(options: schemas.TrainOptions, auto: bool) -> tuple[str, ...]:
    """The learners a job trains: an auto job both (``train.model`` auto or unset) or the one it names; a fixed
    mechanism's job one (default the MLP)."""
    if options.model in (None, "auto"):
        if options.model == "auto" and not auto:
            raise _invalid("train.model 'auto' chooses a learner on unbiased validation labels, which an auto job "
                           "keeps: use release.mechanism 'auto', or train.model 'mlp' or 'gbdt'")
        return ("mlp", "gbdt") if auto else ("mlp",)
    return (options.model,)


def _fits(request: schemas.JobRequest, auto: bool) -> int:
    """Models a job fits per learner: one, stages of lp-mst, or at most an auto job's (features_party/auto.py): two
    regularizations × (two folds of the unbiased part, one fit per other part, two folds of them all pooled, two of
    ALIBI's part pooled with RR's), the chosen one refitted, and LP-2ST's two stages."""
    if auto:
        release = request.release
        assert isinstance(release, schemas.AutoRelease)
        candidates = release.candidates or max(parts.REGRESSION_ARMS, parts.CLASS_ARMS, key=len)
        arms, soft = len(candidates), any(arm in parts.SOFT_ARMS for arm in candidates)
        return 2 * (2 + (arms - 1) + 2 * (arms > 1) + 2 * soft) + 1 + 2
    return request.stages if request.protocol == "lp-mst" else 1


def _estimate_plan(request: schemas.JobRequest, existing: shared_schemas.Release | None,
                   dataset: shared_schemas.Dataset, classes: bool) -> EstimatePlan | None:
    """A fixed job's estimate rows: from its own release when that is unbiased (or an existing release, whose
    document decides when the job runs), else by a release of their own — which a source dataset's release, covering
    every row, leaves no room for (no estimate)."""
    release = request.release
    if request.estimate_fraction <= 0 or isinstance(release, schemas.AutoRelease):
        return None
    seed = request.train.seed
    if existing is not None and existing.mechanism in shared_schemas.CENTRAL_CLASS_RELEASES:
        return None  # PATE's votes come from no local randomizer: nothing unbiased to estimate with
    if existing is not None or (release is not None and request.protocol == "single"
                                and parts.unbiased(release.mechanism, release.clip, classes)):
        return EstimatePlan(request.estimate_fraction, seed, None)
    if dataset.labels_at != "service":
        return None
    return EstimatePlan(request.estimate_fraction, seed,
                        parts.VALIDATION_MECHANISM["classes" if classes else "regression"])


def _auto_plan(plan: JobPlan, dataset: shared_schemas.Dataset, frame: pd.DataFrame, minimum: int) -> JobPlan:
    release = plan.request.release
    assert isinstance(release, schemas.AutoRelease)
    classes = dataset.label_kind == "classes"
    if dataset.labels_at != "service":
        raise _invalid("an auto job releases disjoint parts of its rows, which a source dataset's release (all its "
                       "rows) cannot: use a fixed mechanism")
    default = parts.CLASS_ARMS if classes else parts.REGRESSION_ARMS
    allowed = default + parts.OPT_IN_ARMS["classes" if classes else "regression"]
    arms = tuple(dict.fromkeys(release.candidates or default))
    wrong = [arm for arm in arms if arm not in allowed]
    if wrong:
        raise _invalid(f"auto candidate(s) {', '.join(wrong)} do not fit {dataset.label_kind} labels; choose among "
                       f"{', '.join(allowed)}")
    if "mlp" not in plan.configs and any(arm in parts.SOFT_ARMS for arm in arms):
        if release.candidates is not None:
            raise _invalid("auto candidate alibi trains on soft labels, which only the MLP learns from: add "
                           "train.model 'mlp', or leave alibi out")
        arms = tuple(arm for arm in arms if arm not in parts.SOFT_ARMS)  # the default, for trees alone
    validations = (parts.VALIDATION_MECHANISM["classes"],) if classes else \
        (parts.VALIDATION_MECHANISM["regression"], *parts.VALIDATION_FALLBACK.values())
    if release.validation is not None and release.validation not in validations:
        raise _invalid(f"auto validation {release.validation!r} does not fit {dataset.label_kind} labels; choose "
                       f"among {', '.join(validations)}")
    rows = len(plan.training_ids(frame))
    auto = AutoPlan.build(arms, classes, release.epsilon, rows, plan.request.train.seed, release.validation)
    if auto.label_epsilon < parts.MIN_EPSILON:
        raise LabelDPError(f"epsilon {release.epsilon:g} is too small for an auto job, which spends at least "
                           f"{parts.MIN_EPSILON:g} on the labels' mean and on the labels each",
                           code=ErrorCode.EPSILON_OUT_OF_RANGE)
    return JobPlan(plan.request, plan.labels_party, plan.url, plan.features_file, plan.configs, plan.num_classes,
                   None, plan.held_out, None, auto)


def _checked_auto(plan: JobPlan, frame: pd.DataFrame, client: LabelsPartyClient) -> JobPlan:
    """The auto job's releases — its central mean, its validation release, its candidates' parts and LP-2ST's two
    stages — checked by the labels party before any is asked for: each refusal there is decided by public inputs
    (the dataset's domain, ε, the ids, a body's size), so none is refused after another part was charged. Refused
    for what the mechanism cannot take on this dataset (:data:`MECHANISM_REFUSALS`): a numeric job's validation
    mechanism opt-unbiased is replaced by dbrr (unbiased, any domain); a default candidate is left out; a named
    candidate, or the mean, refuses the job (400, nothing spent), as does any other refusal (an unknown id). The
    request then names what was kept, so every attempt plans the same parts without asking again."""
    release, auto = plan.request.release, plan.auto
    assert isinstance(release, schemas.AutoRelease) and auto is not None
    named = release.candidates is not None
    ids = plan.training_ids(frame).astype(str)
    if auto.mean_epsilon > 0:  # every training row, whatever the parts: checked once
        mean = shared_schemas.EvaluationRequest(metric="mean", epsilon=auto.mean_epsilon, example_ids=ids.tolist())
        code = _check(plan, client, mean)
        if code is not None:
            raise _refused_part("the labels' central mean (the constant every candidate must beat)", code)
    while True:
        auto, release = plan.auto, plan.request.release
        assert auto is not None and isinstance(release, schemas.AutoRelease)
        refused = _refusals(plan, auto, ids, client)
        if not refused:
            return plan
        validation = auto.validation
        if validation in refused:
            if validation not in parts.VALIDATION_FALLBACK:
                raise _refused_part(f"its validation release ({validation})", refused[validation])
            validation = parts.VALIDATION_FALLBACK[validation]
        failed = [arm for arm in auto.arms if arm in refused]
        if failed and named:
            raise _refused_part(f"auto candidate {failed[0]!r}", refused[failed[0]], "leave it out of candidates")
        kept = tuple(arm for arm in auto.arms if arm not in refused)
        if not kept:
            raise _refused_part(f"every auto candidate ({', '.join(failed)})", refused[failed[0]])
        named_now = release.model_copy(update={"candidates": list(kept), "validation": validation})
        request = plan.request.model_copy(update={"release": named_now})
        plan = replace(plan, request=request, auto=replace(auto, arms=kept, validation=validation))


# What a mechanism cannot take on a dataset, public: its label limit, its solver's ε floor, the size of what it would
# publish, or of its request's body. A default candidate refused so is left out; any other refusal refuses the job.
MECHANISM_REFUSALS = frozenset({ErrorCode.DOMAIN_TOO_LARGE, ErrorCode.EPSILON_OUT_OF_RANGE,
                                ErrorCode.DOCUMENT_TOO_LARGE, ErrorCode.TOO_LARGE, ErrorCode.BODY_TOO_LARGE})


def _refusals(plan: JobPlan, auto: AutoPlan, ids: pd.Index, client: LabelsPartyClient) -> dict[str, str]:
    """The labels party's refusal code of each of the auto job's part releases it would refuse, by part (a
    mechanism, lp-2st): the releases :func:`features_party.auto.request_auto_releases` asks for after the mean, and
    LP-2ST's stages on its part as :func:`features_party.multistage.train_multistage` will ask for them. A refusal
    other than a :data:`MECHANISM_REFUSALS` raises (the job is refused, nothing spent)."""
    checks: list[tuple[str, shared_schemas.CheckedRelease]] = [
        (mechanism, shared_schemas.ReleaseRequest(mechanism=mechanism, epsilon=auto.label_epsilon,
                                                  example_ids=part_ids))
        for _suffix, mechanism, part_ids in auto.releases(ids)]
    if "lp-2st" in auto.arms:
        checks += [("lp-2st", stage) for stage in _stage_checks(ids[auto.parts(ids) == "lp-2st"], 2, auto.seed,
                                                                auto.label_epsilon)]
    refused: dict[str, str] = {}
    for part, request in checks:
        if part in refused:
            continue
        error = _check(plan, client, request)
        if error is not None:
            refused[part] = error
    return refused


def _stage_checks(rows: pd.Index, stages: int, seed: int, epsilon: float) -> list[shared_schemas.CheckedRelease]:
    """LP-MST's stage releases on ``rows`` (in the order it trains on them): RR on the first stage's, then the
    shape of each later stage's per-example prior release."""
    first, *later = parts.lp_mst_parts(len(rows), stages, seed)
    out: list[shared_schemas.CheckedRelease] = []
    if len(first):
        out.append(shared_schemas.ReleaseRequest(mechanism="rr", epsilon=epsilon, example_ids=rows[first].tolist()))
    out += [shared_schemas.PriorReleaseShape(epsilon=epsilon, example_ids=rows[stage].tolist())
            for stage in later if len(stage)]
    return out


def _check(plan: JobPlan, client: LabelsPartyClient, request: shared_schemas.CheckedRelease) -> str | None:
    """The code the labels party would refuse ``request`` with, if one of :data:`MECHANISM_REFUSALS` (else None
    when it would take it); any other refusal is raised as the trainer's own answer."""
    try:
        error = client.check_release(plan.request.dataset_id, request).error
    except (LabelsPartyError, httpx.HTTPError) as err:
        raise upstream_error(err, plan.labels_party) from None
    if error is None:
        return None
    if error.code not in MECHANISM_REFUSALS:
        raise upstream_error(LabelsPartyError(400, error.code, ""), plan.labels_party)
    return error.code


def _checked_stages(plan: JobPlan, frame: pd.DataFrame, client: LabelsPartyClient) -> None:
    """A fixed lp-mst job's stages checked before its first is charged (the estimate rows' release is asked for
    first, and may be refused alone: then the job has no estimate, and nothing was charged for it)."""
    release = plan.request.release
    assert release is not None and not isinstance(release, schemas.AutoRelease)
    ids = plan.training_ids(frame)
    rows = ids[~ids.isin(plan.estimate_ids(ids))]
    for stage in _stage_checks(rows.astype(str), plan.request.stages, plan.config.seed, release.epsilon):
        code = _check(plan, client, stage)
        if code is not None:
            raise _refused_part("a stage of lp-mst", code, "use fewer classes, fewer examples or more stages")


def _refused_part(what: str, code: str, instead: str = "use a fixed mechanism") -> LabelDPError:
    return LabelDPError(f"the labels party would refuse {what} on this dataset ({code}): {instead}; nothing was "
                        "spent", code=ErrorCode.LABELS_PARTY_REFUSED)


def _check_training_rows(plan: JobPlan, frame: pd.DataFrame, minimum: int) -> None:
    """Enough rows to train on once the estimate rows (or an auto job's selection and estimate rows) are kept."""
    if plan.existing_release is not None or (plan.request.release is not None
                                             and plan.request.release.example_ids is None):
        return  # a source dataset's or an existing release's rows are known once downloaded
    ids = plan.training_ids(frame)
    if plan.auto is not None:
        training = plan.auto.smallest_fit(ids)
        what = "in the smallest of the auto job's candidate fits: a fold or a part of its training rows"
    else:
        training = len(ids) - len(plan.estimate_ids(ids))
        what = "rows left once its estimate rows are kept"
    if training < minimum:
        raise LabelDPError(f"the job would train on {training} example(s) ({what}); this trainer trains on at least "
                           f"{minimum} (min_train_examples)", code=ErrorCode.TOO_FEW_EXAMPLES)


def _rows_to_train(frame: pd.DataFrame, request: schemas.JobRequest, held_out: pd.Index, minimum: int) -> int:
    """How many examples the job would train on at most: its ``example_ids``, each of which must have features, or
    the rows of its features table (the ids a release of the whole dataset is narrowed to: :func:`_naming_ids`),
    less those its split holds out. Counted, never named: no message names an example id."""
    ids = request.release.example_ids if request.release is not None else None
    if ids is not None:
        missing = pd.Index(ids).difference(frame.index)
        if len(missing):
            raise LabelDPError(f"{len(missing)} of the {len(ids)} requested example ids have no features in table "
                               f"{request.features!r}", code=ErrorCode.UNKNOWN_EXAMPLE_IDS)
    candidates = frame.index if ids is None else pd.Index(ids)
    rows = int(np.count_nonzero(~candidates.isin(held_out)))
    if rows < minimum:
        split = f" ({len(held_out)} of the table's rows held out by its split)" if request.split is not None else ""
        raise LabelDPError(f"the job would train on {rows} example(s){split}; this trainer trains on at least "
                           f"{minimum} (min_train_examples)", code=ErrorCode.TOO_FEW_EXAMPLES)
    return rows


def _naming_ids(request: schemas.JobRequest, frame: pd.DataFrame, held_out: pd.Index,
                dataset: shared_schemas.Dataset) -> schemas.JobRequest:
    """A release of the whole dataset is asked for the ids of the features table instead (less those its split
    holds out): the trainer can only train on examples that have features, so no other example is charged, and ids
    the dataset lacks are refused by the labels party (counted, before anything is drawn or charged) — a table
    sharing no id with the labels spends nothing. A source dataset's release covers all its rows (the labels
    party's rule): it is asked for as it is, and the job trains on its rows that are not held out."""
    release = request.release
    if release is None or release.example_ids is not None or dataset.labels_at != "service":
        return request
    training = frame.index[~frame.index.isin(held_out)]
    named = release.model_copy(update={"example_ids": training.astype(str).tolist()})
    return request.model_copy(update={"release": named})


# Options of the MLP alone: a gbdt job gives them at their defaults (or not at all).
MLP_OPTIONS = ("hidden", "embed_dim", "learning_rate", "l2", "batch_size", "epochs", "patience", "standardize_targets")


def _check_model(request: schemas.JobRequest, learners: tuple[str, ...], auto: bool) -> None:
    """The learner's options fit the learners: no tree options on an MLP job, no MLP option (other than its
    default) on a tree job (an auto job takes both), and the trees need at least one feature column."""
    options = request.train
    if learners == ("mlp",):
        if options.gbdt is not None:
            raise _invalid("train.gbdt options are for train.model 'gbdt'; this job trains the MLP")
        return
    if not auto:
        defaults = schemas.TrainOptions()
        given = [name for name in MLP_OPTIONS if getattr(options, name) != getattr(defaults, name)]
        if given:
            raise _invalid(f"train.model 'gbdt' does not use the MLP option(s) {', '.join(given)}: give tree "
                           "options in train.gbdt (learning_rate, n_estimators, max_depth, ...)")
    if not request.numeric and not request.categorical:
        raise _invalid("train.model 'gbdt' needs at least one numeric or categorical feature column")
    if options.validation_fraction <= 0 and not auto:
        raise _invalid("train.model 'gbdt' stops early on a validation split of the privatized labels: give "
                       "train.validation_fraction > 0 (to boost a fixed number of rounds, set "
                       "train.gbdt.early_stopping_rounds to n_estimators)")


def _config(options: schemas.TrainOptions, learner: str, loss: str) -> Config:
    if learner == "gbdt":
        trees = (options.gbdt or schemas.GbdtOptions()).model_dump()
        return gbdt.GbdtConfig.from_dict({**trees, "loss": loss, "validation_fraction": options.validation_fraction,
                                          "seed": options.seed})
    return TrainConfig.from_dict({**options.model_dump(exclude={"model", "gbdt", "validation_fraction"}),
                                  "loss": loss, "validation_fraction": options.validation_fraction})


def _check_size(settings: TrainerSettings, request: schemas.JobRequest, learners: tuple[str, ...],
                vocab_sizes: tuple[int, ...], rows: int, *, output_dim: int, fits: int) -> None:
    """Refuses a job over ``max_job_size``, its learners' sizes added (an auto job trains both): for the MLP
    parameters × epochs × fits (stages of lp-mst, an auto job's candidates) × rows, the parameters of the model the
    job would build; for trees :func:`features_party.learn.gbdt.work` (a tree unit's cost × rounds × trees per round ×
    rows × features × depth) × fits. An auto job counts each fit on every training row: an upper bound."""
    sizes = [_size(request, learner, vocab_sizes, rows, output_dim=output_dim, fits=fits) for learner in learners]
    total = sum(size for size, _ in sizes)
    if total > settings.max_job_size:
        what = " + ".join(text for _, text in sizes)
        raise LabelDPError(f"job size {total:.3g} = {what} is over this trainer's limit of "
                           f"{settings.max_job_size:.3g} (max_job_size): use fewer or smaller layers, fewer epochs, "
                           "rounds, shallower trees, fewer features, rows or categorical levels",
                           code=ErrorCode.JOB_TOO_LARGE)


def _size(request: schemas.JobRequest, learner: str, vocab_sizes: tuple[int, ...], rows: int, *, output_dim: int,
          fits: int) -> tuple[int, str]:
    """One learner's size and how it is made up."""
    if learner == "gbdt":
        options = request.train.gbdt or schemas.GbdtOptions()
        features, trees = len(request.numeric) + len(request.categorical), max(output_dim, 1)
        rounds = options.n_estimators * fits
        wide = [c for c, v in zip(request.categorical, vocab_sizes, strict=True) if v - 1 > gbdt.MAX_CATEGORIES]
        if wide:
            raise _invalid(f"categorical column(s) {wide} have more than {gbdt.MAX_CATEGORIES:,} levels, more than "
                           "XGBoost's categorical features take: group rare levels, or give the column to the MLP")
        size = gbdt.work(rounds, options.max_depth, trees, rows, features, vocab_sizes)
        splits = gbdt.nodes_per_tree(options.max_depth, rows) // 2
        levels = f" + {gbdt.CATEGORY_UNITS} × {splits:,} splits × {sum(vocab_sizes):,} categorical bins" \
            if vocab_sizes else ""
        return size, (f"{gbdt.UNIT_COST} × {rounds:,} rounds × {trees:,} tree(s) per round × ({rows:,} rows × "
                      f"{features:,} features × depth {options.max_depth}{levels})")
    spec = models.ModelSpec(len(request.numeric), vocab_sizes, request.train.embed_dim, tuple(request.train.hidden),
                            output_dim)
    parameters = models.num_params(spec)
    epochs = request.train.epochs * fits
    return parameters * epochs * rows, f"{parameters:,} parameters × {epochs:,} epochs × {rows:,} rows"


# What an MLP job holds (mlp_memory), in bytes: 8 float32 copies of each parameter (the model, RMSProp's state, the
# gradients and the update, the kept best, the scan's carry in and out, the result brought back: ~25 bytes a
# parameter measured, issue 40); 3 float32 numbers per activation of a batch (its value, the pre-activation kept for
# the backward pass and its gradient); 8 bytes per training cell (the table's column and its copy on the device).
MLP_PARAMETER_BYTES = 32
MLP_ACTIVATION_BYTES = 12
MLP_CELL_BYTES = 8


@dataclass(frozen=True)
class MlpMemory:
    """What an MLP job holds at most, in bytes: its parameters' copies (an auto job's candidates kept besides),
    a batch's activations, and the training matrices."""

    parameters: int
    activations: int
    matrices: int

    @property
    def total(self) -> int:
        return self.parameters + self.activations + self.matrices

    def describe(self) -> str:
        return (f"{self.total:.3g} bytes = parameters {self.parameters:.3g} + activations {self.activations:.3g} + "
                f"training matrices {self.matrices:.3g}")


def mlp_memory(spec: models.ModelSpec, batch_size: int, rows: int, fits: int = 1) -> MlpMemory:
    """:class:`MlpMemory` of an MLP job, from public inputs: the model the request builds, its batch size (at most
    the rows), the rows it trains on, and how many models it fits (each kept as float32 numbers)."""
    parameters = models.num_params(spec)
    widths = (spec.num_numeric + spec.embed_dim * len(spec.vocab_sizes), *spec.hidden, spec.output_dim)
    batch = max(1, min(batch_size, rows))
    return MlpMemory(parameters * (MLP_PARAMETER_BYTES + 4 * (fits - 1)), MLP_ACTIVATION_BYTES * batch * sum(widths),
                     MLP_CELL_BYTES * rows * (spec.num_numeric + len(spec.vocab_sizes)))


def _check_mlp_memory(settings: TrainerSettings, request: schemas.JobRequest, learners: tuple[str, ...],
                      vocab_sizes: tuple[int, ...], rows: int, *, output_dim: int, fits: int) -> None:
    """Refuses an MLP job whose memory (:func:`mlp_memory`) is over ``max_mlp_bytes``: memory that ``max_job_size``
    does not bound (a model of 10⁸ parameters trained for one epoch on a few thousand rows is small by it)."""
    if "mlp" not in learners:
        return
    options = request.train
    spec = models.ModelSpec(len(request.numeric), vocab_sizes, options.embed_dim, tuple(options.hidden), output_dim)
    memory = mlp_memory(spec, options.batch_size, rows, fits)
    if memory.total > settings.max_mlp_bytes:
        raise LabelDPError(f"the MLP may take {memory.describe()} ({models.num_params(spec):,} parameters, hidden "
                           f"{list(options.hidden)}, batch {options.batch_size:,}, {rows:,} rows), over this "
                           f"trainer's limit of {settings.max_mlp_bytes:.3g} (max_mlp_bytes): use fewer or smaller "
                           "layers, a smaller embed_dim or batch, fewer categorical levels or rows",
                           code=ErrorCode.JOB_TOO_LARGE)


PREDICTION_ROW_BYTES = 32  # a predictions file's row: its id, prediction and holdout flag, as Parquet keeps them
MODEL_PARAMETER_BYTES = 4  # an MLP parameter in its .npz (float32)


# The blocks of a job's directories and files besides their bytes (quotas count what the disk allocates: a job of
# 1,500 rows took 65,536 bytes of blocks for 62,615 estimated)
OUTPUT_FILES_BYTES = 32 * BLOCK


def _output_bytes(request: schemas.JobRequest, learners: tuple[str, ...], vocab_sizes: tuple[int, ...],
                  table_rows: int, rows: int, output_dim: int, fits: int, features_file: str) -> int:
    """What a job's outputs store at most (checked against its organization's storage quota when it is created):
    a prediction for every row of its table (each class's probability for a class model) with the row's id (as
    long as the table's: 400-character ids made a predictions file 12.6 times a count of 32 bytes a row, the
    twenty-ninth review), and its learners' models — the MLP's parameters, the trees' most nodes
    (:func:`features_party.learn.gbdt.memory`)."""
    total = PREDICTION_ROW_BYTES * table_rows * max(output_dim, 1) + _id_bytes(features_file) + OUTPUT_FILES_BYTES
    for learner in learners:
        if learner == "gbdt":
            trees = request.train.gbdt or schemas.GbdtOptions()
            total += gbdt.memory(trees.n_estimators * fits, trees.max_depth, max(output_dim, 1), rows,
                                 len(request.numeric), vocab_sizes).model
        else:
            spec = models.ModelSpec(len(request.numeric), vocab_sizes, request.train.embed_dim,
                                    tuple(request.train.hidden), output_dim)
            total += MODEL_PARAMETER_BYTES * models.num_params(spec) * fits
    return total


def _id_bytes(features_file: str) -> int:
    """The bytes of a features table's ids, from its files' Parquet metadata (no row read)."""
    total = 0
    for file in joined.parquet_files(Path(features_file)):
        metadata = pq.read_metadata(file)
        column = metadata.schema.names.index("example_id") if "example_id" in metadata.schema.names else None
        if column is not None:
            total += sum(metadata.row_group(g).column(column).total_uncompressed_size
                         for g in range(metadata.num_row_groups))
    return total


def _check_outputs(settings: TrainerSettings, request: schemas.JobRequest, learner: str, table_rows: int, rows: int,
                   output_dim: int, vocab_sizes: tuple[int, ...], *, fits: int) -> None:
    """Refuses a job whose predictions (every row of its features table × the model's outputs) are over
    ``max_prediction_cells``, or whose trees may take more than ``max_tree_bytes``
    (:func:`features_party.learn.gbdt.memory`: the model — every fit's, an auto job keeps its candidates —, XGBoost's
    cached histograms and the training matrices): memory that neither learner's ``max_job_size`` counts — a job
    training on ten rows of a 100,000-class dataset is small by it."""
    cells = table_rows * output_dim
    if cells > settings.max_prediction_cells:
        raise LabelDPError(f"the job's predictions are {cells:.3g} numbers = {table_rows:,} rows of features table "
                           f"{request.features!r} × {output_dim:,} outputs, over this trainer's limit of "
                           f"{settings.max_prediction_cells:.3g} (max_prediction_cells): use a smaller features "
                           "table or fewer classes", code=ErrorCode.JOB_TOO_LARGE)
    if learner != "gbdt":
        return
    options = request.train.gbdt or schemas.GbdtOptions()
    rounds = options.n_estimators * fits
    memory = gbdt.memory(rounds, options.max_depth, max(output_dim, 1), rows, len(request.numeric), vocab_sizes)
    if memory.total > settings.max_tree_bytes:
        raise LabelDPError(f"the trees may take {memory.describe()} ({rounds:,} rounds, depth {options.max_depth}, "
                           f"{rows:,} rows, {len(request.numeric)} numeric features, categorical levels "
                           f"{', '.join(f'{v - 1:,}' for v in vocab_sizes) or 'none'}), over this trainer's limit "
                           f"of {settings.max_tree_bytes:.3g} (max_tree_bytes): use fewer rounds, shallower trees, "
                           "fewer rows, features or categorical levels (a categorical split lists its levels)",
                           code=ErrorCode.JOB_TOO_LARGE)
    if memory.model / fits > gbdt.MAX_MODEL_BYTES:
        raise LabelDPError(f"the trees' model may take {memory.model / fits:.3g} bytes, more than labeldp predict "
                           f"reads ({gbdt.MAX_MODEL_BYTES:.3g}): use fewer rounds, shallower trees or fewer "
                           "categorical levels", code=ErrorCode.JOB_TOO_LARGE)


def _loss_for(request: schemas.JobRequest, mechanism: str,
              dataset: shared_schemas.Dataset) -> tuple[str, int | None]:
    """The loss and class count a job trains with, checked against the dataset's label kind, the mechanism and
    the protocol."""
    loss = request.train.loss
    if dataset.label_kind == "classes":
        classes = int(dataset.domain["num_classes"])
        if mechanism == "auto":
            if loss not in (None, "cross_entropy"):
                raise _invalid(f"loss {loss!r} does not fit class labels; an auto job trains with 'cross_entropy'")
            if request.num_classes not in (None, classes):
                raise _invalid(f"num_classes {request.num_classes} differs from the dataset's {classes} classes")
            return "cross_entropy", classes
        if mechanism not in (*shared_schemas.CLASSIFICATION_MECHANISMS, *shared_schemas.CENTRAL_CLASS_RELEASES):
            raise _invalid(f"mechanism {mechanism!r} does not fit class labels; use one of "
                           f"{', '.join(shared_schemas.CLASSIFICATION_MECHANISMS)}")
        expected = mechanism if mechanism in ("subset", "alibi") else "cross_entropy"  # their own losses
        if loss not in (None, expected):
            raise _invalid(f"loss {loss!r} does not fit {mechanism} releases of class labels; use {expected!r}")
        if request.num_classes not in (None, classes):
            raise _invalid(f"num_classes {request.num_classes} differs from the dataset's {classes} classes")
        if request.protocol == "lp-mst" and mechanism not in ("rr", "rr-with-prior"):
            raise _invalid("lp-mst releases with randomized response and RRWithPrior (mechanism 'rr')")
        return expected, classes
    if mechanism not in (*shared_schemas.REGRESSION_MECHANISMS, "auto"):
        raise _invalid(f"mechanism {mechanism!r} does not fit {dataset.label_kind} labels; use one of "
                       f"{', '.join(shared_schemas.REGRESSION_MECHANISMS)}")
    if request.protocol != "single":
        raise _invalid("lp-mst needs a classes dataset")
    if request.num_classes is not None:
        raise _invalid("num_classes is for classes datasets")
    loss = loss or "squared"
    if loss not in ("squared", "poisson"):
        raise _invalid(f"loss {loss!r} does not fit {dataset.label_kind} labels; use 'squared' or 'poisson'")
    if loss == "poisson" and _lowest(dataset.domain) < 0:
        raise _invalid("the Poisson loss needs non-negative labels; this dataset's domain goes below 0")
    return loss, None


def _lowest(domain: dict) -> float:
    return float(domain["values"][0]) if domain.get("kind") == "finite" else float(domain.get("min", 0.0))
