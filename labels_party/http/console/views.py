"""What the console's pages show, gathered through the service's own functions — the same access rules, budget
figures and ledger the API answers with (nothing here does accounting of its own):

* budgets: :func:`labels_party.releases.datasets.list_datasets` / :func:`~labels_party.releases.datasets.budget` (``GET
  /v1/datasets``, ``GET /v1/datasets/{id}/budget``);
* releases per organization and mechanism, and ε spent over time: the ledger records of
  :func:`labels_party.http.audit.audit` (``GET /v1/audit``), which also gives the hash chain's status;
* per-example spent ε: the ledger's coverage classes, summed over the organizations' accounts
  (``ctx.ledger.spent_by_example``);
* a release and its mechanism document: :mod:`labels_party.releases.queries` (``GET /v1/releases/{id}``, ``GET
  /v1/mechanisms/{hash}``);
* verification: :func:`labels_party.http.audit.verify_audit` (``labeldp labels verify-audit``).

Another organization's dataset or release raises the service's own 404."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np

from labels_party.http import access
from labels_party.http import audit as audit_log
from labels_party.http.auth import Principal
from labels_party.http.console import randomizer
from labels_party.ledger import UNNAMED, RecordSummary, budgets, documents, units_epsilon
from labels_party.releases import datasets as dataset_service
from labels_party.releases import queries
from labels_party.runtime.context import ServiceContext
from shared import schemas

HISTOGRAM_BINS = 20
MAX_FIELDS = 60
MAX_GROUPS_SHOWN = 3


@dataclass(frozen=True)
class OrgUse:
    """One organization's use of a dataset: granted or not, its releases and the sum of their charges (ε)."""

    org: str
    granted: bool
    releases: int = 0
    charged: float = 0.0


@dataclass(frozen=True)
class DatasetCard:
    dataset: schemas.Dataset
    orgs: list[OrgUse]


def _org_uses(summaries: list[RecordSummary], granted: set[str]) -> list[OrgUse]:
    releases: dict[str, int] = defaultdict(int)
    units: dict[str, int] = defaultdict(int)
    for summary in summaries:
        releases[summary.org] += 1
        units[summary.org] += summary.charged_units
    return [OrgUse(org, org in granted, releases[org], units_epsilon(units[org]))
            for org in sorted(granted | set(releases))]


def _summaries(events: list[schemas.AuditEvent]) -> list[RecordSummary]:
    return [RecordSummary.of(event.record) for event in events]


def datasets_overview(ctx: ServiceContext, principal: Principal) -> list[DatasetCard]:
    datasets = dataset_service.list_datasets(ctx, principal)
    audit = audit_log.audit(ctx, principal, None)
    with ctx.sessions() as session, session.begin():
        grants = access.grantees(session, [d.id for d in datasets])
    events: dict[str, list[schemas.AuditEvent]] = defaultdict(list)
    for event in audit.events:
        events[event.dataset_id].append(event)
    return [DatasetCard(d, _org_uses(_summaries(events[d.id]), grants[d.id])) for d in datasets]


@dataclass(frozen=True)
class Usage:
    org: str
    mechanism: str
    releases: int
    charged: float
    examples: int


@dataclass(frozen=True)
class Histogram:
    """Examples by spent ε: ``counts[i]`` examples in (edges[i], edges[i+1]]; ``never`` spent nothing."""

    counts: list[int]
    edges: list[float]
    never: int
    examples: int
    most: float


@dataclass(frozen=True)
class DatasetPage:
    dataset: schemas.Dataset
    budget: schemas.Budget
    chain_valid: bool
    timeline: list[tuple[datetime, float]]
    usage: list[Usage]
    releases: list[tuple[schemas.Release, str]]
    histogram: Histogram
    orgs: list[OrgUse]
    uploads: list[schemas.UploadEvent] = field(default_factory=list)


def _histogram(spent: np.ndarray, sizes: np.ndarray, total_units: int) -> Histogram:
    """Examples by spent ε, from the ledger's coverage classes (one value and a count per class)."""
    charged = spent > 0
    top = max(total_units, int(spent.max()) if spent.size else 0) or 1
    edges = np.linspace(0, top, HISTOGRAM_BINS + 1)
    counts, _ = np.histogram(spent[charged], bins=edges, weights=sizes[charged])
    examples = int(sizes.sum())
    return Histogram([int(c) for c in counts], [units_epsilon(int(round(e))) for e in edges],
                     examples - int(sizes[charged].sum()), examples,
                     units_epsilon(int(spent.max())) if spent.size else 0.0)


def _timeline(created: datetime, summaries: list[RecordSummary]) -> list[tuple[datetime, float]]:
    """The dataset's spent ε after each record: the sum of every organization's largest per-example use so far
    (records before per-organization accounts carry the dataset's own maximum)."""
    points, latest = [(created, 0.0)], {}
    for summary in summaries:
        if summary.spent_max_after_units is not None and summary.created_at is not None:
            latest[summary.account] = summary.spent_max_after_units
            points.append((summary.created_at, units_epsilon(sum(latest.values()))))
    return points


def dataset_page(ctx: ServiceContext, principal: Principal, dataset_id: str) -> DatasetPage:
    with ctx.sessions() as session, session.begin():  # the 404 of another organization's dataset comes first
        admission = access.decide(session, principal, access.ADMINISTER_DATASET, dataset_id, ctx.settings)
    budget = dataset_service.budget(ctx, admission)
    dataset = dataset_service.get_dataset(ctx, admission)
    audit = audit_log.audit(ctx, principal, dataset_id)
    with ctx.sessions() as session, session.begin():
        row = access.admitted_dataset(session, admission)
        spent, sizes = budgets.spent_by_example(ctx.ledger, session, row)
        grants = access.grantees(session, [dataset_id])
    summaries = _summaries(audit.events)
    org_of = {s.release_id: s.org for s in summaries}
    groups: dict[tuple[str, str], list[RecordSummary]] = defaultdict(list)
    for summary in summaries:
        groups[(summary.org, summary.mechanism)].append(summary)
    usage = [Usage(org, mechanism, len(records), units_epsilon(sum(r.charged_units for r in records)),
                   sum(r.examples_covered for r in records))
             for (org, mechanism), records in sorted(groups.items())]
    releases = [(r, org_of.get(r.id, UNNAMED)) for r in queries.list_releases(ctx, admission)]
    return DatasetPage(dataset, budget, audit.chain_valid, _timeline(dataset.created_at, summaries), usage,
                       releases, _histogram(spent, sizes, row.epsilon_total_units),
                       _org_uses(summaries, grants[dataset_id]), audit.uploads)


@dataclass(frozen=True)
class Randomizer:
    title: str
    blocks: randomizer.Blocks | None
    outputs: list[tuple[int, str]]
    num_outputs: int | None
    noise: dict | None


@dataclass(frozen=True)
class ReleasePage:
    release: schemas.Release
    org: str
    fields: list[tuple[str, str]]
    randomizers: list[Randomizer]
    prior: np.ndarray | None
    num_groups: int


def _flat(value, prefix: str = "") -> list[tuple[str, str]]:
    """A mechanism summary as (key, short text) pairs."""
    if isinstance(value, dict):
        return [pair for k, v in value.items() for pair in _flat(v, f"{prefix}{k}.")]
    text = value if isinstance(value, str) else json.dumps(value)
    return [(prefix[:-1], text if len(text) <= 120 else text[:117] + "...")]


def _randomizer(title: str, description: dict) -> Randomizer:
    outputs = description.get("output_values") or []
    noise = description.get("noise") if isinstance(description.get("noise"), dict) else None
    return Randomizer(title, randomizer.blocks(description), randomizer.sample_values(outputs),
                      description.get("num_outputs") if outputs else None, noise)


def release_page(ctx: ServiceContext, principal: Principal, release_id: str) -> ReleasePage:
    release, _ = queries.get_release(ctx, principal, release_id)
    document = (queries.get_mechanism_document(ctx, principal, release.mechanism_hash)[1]
                if release.mechanism_hash else {})  # a running or failed release has no mechanism yet
    description = document.get("description") or {}
    audit = audit_log.audit(ctx, principal, release.dataset_id)
    org = next((s.org for s in _summaries(audit.events) if s.release_id == release.id), UNNAMED)
    groups = description.get("groups") or {}
    names = groups.get("group") or []
    if names:  # a group release, described in columns (pipeline.GroupPrivatization.describe)
        grid = {"input_values": description.get("grid") or [], "output_values": description.get("grid") or []}
        shown = [_randomizer(f"group {name} ({examples} examples)", {**grid, **description["mechanisms"][index]})
                 for name, examples, index in zip(names[:MAX_GROUPS_SHOWN], groups["examples"],
                                                  groups["mechanism"], strict=False)]
    else:
        shown = [_randomizer(str(description.get("mechanism", release.mechanism)), description)]
    prior = (document.get("noisy_prior") or {}).get("noisy_counts")
    return ReleasePage(release, org, _flat(documents.summary(description))[:MAX_FIELDS], shown,
                       randomizer.summed_bars(prior) if prior else None, len(names))


def verify(ctx: ServiceContext, principal: Principal, dataset_id: str) -> tuple[bool, dict]:
    """(the API's chain status, this dataset's verification report: its own work only)."""
    chain_valid = audit_log.audit(ctx, principal, dataset_id).chain_valid  # admin of the owner, else 404
    return chain_valid, audit_log.verify_audit(ctx, dataset_id)["datasets"][0]
