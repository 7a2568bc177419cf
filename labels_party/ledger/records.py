"""Ledger records — frozen values built in one place — their hash chain, and their one reader."""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter
from sqlalchemy import select
from sqlalchemy.orm import Session

from labels_party.ledger.charges import charged_units
from labels_party.store import db

COMPOSITION = ("per example and organization: pure epsilon-DP events add (exact integer units); Gaussian events "
               "add their RDP curves, converted at the organization's delta; the two add by basic composition; "
               "disjoint examples compose in parallel")


def canonical(record: dict) -> str:
    return json.dumps(record, sort_keys=True, separators=(",", ":"), allow_nan=False)


def chain_hash(prev_hash: str, record_json: str) -> str:
    return hashlib.sha256((prev_hash + record_json).encode()).hexdigest()


@dataclass(frozen=True)
class Entry:
    """A stored ledger entry: its record (the canonical JSON the chain hashes, and as parsed) and its links."""

    dataset_id: str
    seq: int
    record_json: str
    prev_hash: str
    hash: str

    @functools.cached_property
    def record(self) -> dict[str, Any]:
        """Parsed once per entry (verify-audit reads each record in several passes); not to be modified."""
        return json.loads(self.record_json)

    @property
    def is_release(self) -> bool:
        """A release's charge (a :class:`LedgerRecord`), not a :data:`Fact` about budgets, grants or keys."""
        return is_release(self.record)


def is_release(record: dict[str, Any]) -> bool:
    return record.get("event", "label_release") == "label_release"  # records from before the field: releases


def entries(session: Session, dataset_id: str, after: int = 0, through: int | None = None) -> list[Entry]:
    """A dataset's ledger entries in chain order, those after seq ``after`` and up to ``through`` (None: the last)
    (the only reader of ledger rows)."""
    query = select(db.LedgerEntry).where(db.LedgerEntry.dataset_id == dataset_id, db.LedgerEntry.seq > after)
    if through is not None:
        query = query.where(db.LedgerEntry.seq <= through)
    rows = session.scalars(query.order_by(db.LedgerEntry.seq))
    return [Entry(r.dataset_id, r.seq, r.record, r.prev_hash, r.hash) for r in rows]


def records_by_org(session: Session, chain: Sequence[Entry]) -> tuple[list[dict], list[int]]:
    """The release records of ledger entries and the organization each charged: the one its record names (records
    written before they named their actor have no other than their release's requester)."""
    records = [e.record for e in chain if e.is_release]
    ids = {name: org_id for org_id, name in session.execute(select(db.Organization.id, db.Organization.name))}
    unnamed = [r["release_id"] for r in records if not (r.get("actor") or {}).get("org")]
    requesters = dict(session.execute(select(db.Release.id, db.Release.requester_org_id).where(
        db.Release.id.in_(unnamed))).all()) if unnamed else {}
    return records, [ids.get(str(r["actor"]["org"]), -1) if (r.get("actor") or {}).get("org")
                     else requesters[r["release_id"]] for r in records]


def chain_intact(chain: Sequence[Entry], head: str | None = None) -> bool:
    """Whether ``chain`` (one dataset's entries in order) is unbroken and ends at ``head``."""
    return verify_chain([(e.seq, e.record_json, e.prev_hash, e.hash) for e in chain], head)


def verify_chain(entries, head: str | None = None) -> bool:
    """entries: (seq, record_json, prev_hash, hash) ordered by seq, for one dataset."""
    previous = "0" * 64
    for expected_seq, (seq, record_json, prev_hash, digest) in enumerate(entries, start=1):
        if seq != expected_seq or prev_hash != previous or chain_hash(prev_hash, record_json) != digest:
            return False
        try:
            if json.loads(record_json).get("seq") != seq:
                return False
        except (ValueError, AttributeError):  # a rewritten row that is not a JSON object (verify-audit says which)
            return False
        previous = digest
    return head is None or head == previous


class Actor(BaseModel):
    """Who requested a release: the organization, the key's role, and the key — its id and public prefix (never
    its secret), so that an audit can tell that no key charged after its revocation (None: not recorded)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    org: str
    role: str
    key_id: int | None = None
    key_prefix: str | None = None


class Coverage(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    file: str
    sha256: str


class AccountTerms(BaseModel):
    """The account a charge went to, as it stood: its allocation of every covered example's budget."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    org: str
    epsilon_units: int
    delta: float


class SpentState(BaseModel):
    """An account's spent state after a charge, as the next charge must find it: its class file and RDP file (by
    name) and a digest of what each class has spent (:func:`labels_party.ledger.books.spent_digest`: pure units,
    sizes and RDP curves — not the ε they convert to at the account's δ, which a change of δ rewrites). A state
    row reset or pointed elsewhere outside the service — which would hand out the budget again — is refused."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    classes_file: str | None
    rdp_file: str | None
    digest: str
    # the class file's entries and their SHA-256: which example is in which class (None: a charge from before the
    # thirty-ninth review, whose class file emptied made every example fresh; the account's next charge records them)
    classes_entries: int | None = None
    classes_sha256: str | None = None


class LedgerRecord(BaseModel):
    """One privacy event, completely documented: enough to recompute its (ε, δ) and every example's budget."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    event: Literal["label_release"] = "label_release"
    seq: int
    dataset_id: str
    release_id: str
    created_at: str
    actor: Actor  # the organization the release went to
    account: AccountTerms
    mechanism: str
    request: dict[str, Any]  # the request's privacy parameters (no example ids, features or predictions)
    label_version: int
    epsilon_requested: float
    dp_event: dict[str, Any]  # shared.mechanisms.events.to_dict of the charged event
    charge_units: int  # pure ε, exact; 1 unit = 10⁻⁹ ε
    charge: float  # the same as a decimal, for reading
    rdp_units: list[int] | None  # the RDP curve charged at RDP_ORDERS (events with δ > 0), else None
    delta: float  # the δ at which rdp_units convert to ε (the account's); 0 for pure events
    examples_covered: int
    coverage: Coverage
    spent_max_after_units: int  # the account's, after this charge
    epsilon_total_units: int  # the dataset's
    delta_total: float
    composition: str = COMPOSITION
    # this release's file and mechanism document are stated by a ReleaseFact when it becomes available (records
    # charged before the fact existed lack the field: their files are checked against their rows only)
    file_on_chain: bool = True
    # the account's spent state after this charge (records from before it lack the field)
    spent_state: SpentState | None = None
    # the part of epsilon_requested that privatizes a prior (the rest randomizes the labels): what the release row
    # shows (None in records from before it was recorded)
    prior_epsilon: float | None = None


class _Fact(BaseModel):
    """What every fact carries besides its own fields; the chain fills these in when it appends it."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    seq: int = 0
    dataset_id: str = ""
    created_at: str = ""


class BudgetFact(_Fact):
    """The dataset's per-example budget: at creation, at any change, and once for datasets made before facts were
    chained (``migrated``)."""

    event: Literal["dataset_budget"] = "dataset_budget"
    change: Literal["created", "changed", "migrated"]
    epsilon_total_units: int
    delta_total: float


class OwnerFact(_Fact):
    """The organization that owns the dataset (its admin keys administer it) and whether it allowed central
    training: at creation, and once for datasets made before owners were chained (migration 0019) — so that no row
    edit makes another organization its owner, opens its labels to central training or changes its source."""

    event: Literal["owner"] = "owner"
    org: str
    central_training: bool  # whether the owner allowed central training (LabelDP-Pro, PATE) on it
    # a source dataset's source as its owner asked to register it (None: labels uploaded): the registration copies
    # this, under this owner's prefixes, whatever the row says (issue 40's fifth review: a row edited while the job
    # was queued copied another organization's files into the owner's dataset)
    source: str | None


class DomainFact(_Fact):
    """The dataset's label kind and domain (the row's JSON, by its SHA-256: :func:`domain_digest`) — what every
    release's support, range, clipping and noise scale and every upload's checks are computed from: at creation, and
    once for datasets made before domains were chained (migration 0022), so that no row edit changes them."""

    event: Literal["domain"] = "domain"
    label_kind: str
    domain_sha256: str


def domain_digest(domain_json: str) -> str:
    return hashlib.sha256(domain_json.encode()).hexdigest()


class GrantFact(_Fact):
    """An organization's grant on the dataset."""

    event: Literal["grant"] = "grant"
    change: Literal["created", "removed", "migrated"]
    org: str


class AllocationFact(_Fact):
    """An organization's account as it stands from now on: its allocation of every example's budget."""

    event: Literal["allocation"] = "allocation"
    org: str
    epsilon_units: int
    delta: float


def secret_digest(key_hash: str) -> str:
    """What a :class:`KeyFact` records of a key's secret: a hash of its stored hash (itself SHA-256 of 256 random
    bits), so the chain names the secret a key row must hold without holding anything that authenticates."""
    return hashlib.sha256(f"labeldp-key-fact:{key_hash}".encode()).hexdigest()


class KeyFact(_Fact):
    """An API key of an organization holding an account on the dataset, made or revoked (a revoked key charges
    nothing after this fact). Keys are named by their public prefix, never their secret."""

    event: Literal["key"] = "key"
    change: Literal["created", "revoked"]
    org: str
    role: str
    key_prefix: str
    key_id: int
    # SHA-256 of the key's stored hash (:func:`secret_digest`): a key row whose secret was swapped outside the service
    # is refused (None in facts from before it was recorded)
    secret_digest: str | None = None
    # a revocation: from when the key is refused (a rotation's grace may put it later) and who revoked it
    revoked_at: str | None = None
    revoked_by: str | None = None


class ReleaseFact(_Fact):
    """A release became available: its labels file (bytes and SHA-256 of what a download serves) and its mechanism
    document (content address, certified ε). A release is served only as this fact says; records charged since
    this fact exists say so (``LedgerRecord.file_on_chain``), so that no row edit can make one available."""

    event: Literal["release_available"] = "release_available"
    release_id: str
    file_bytes: int
    file_sha256: str
    mechanism_hash: str
    certified_epsilon: float | None
    # what the release's row shows of it besides its record (:func:`summary_digest`; None in facts from before it
    # was: migration 0022 states theirs in a SummaryFact)
    summary_sha256: str | None = None


def summary_digest(description_json: str, prior_json: str | None, prior_epsilon: float,
                   randomizer_epsilon: float) -> str:
    """A release row's shown summary — its description's and noisy prior's scalars (the mechanism document's, without
    lists) and its ε split — as the row stores it: what a consumer reads of a release (ε, a metric's value and
    interval) besides its record's figures."""
    return hashlib.sha256(canonical({"description": description_json, "noisy_prior": prior_json,
                                     "prior_epsilon": prior_epsilon,
                                     "randomizer_epsilon": randomizer_epsilon}).encode()).hexdigest()


class SummaryFact(_Fact):
    """An available release's shown summary (:func:`summary_digest`), stated once by migration 0022 for releases made
    available before their :class:`ReleaseFact` carried it."""

    event: Literal["release_summary"] = "release_summary"
    release_id: str
    summary_sha256: str


class DocumentFact(_Fact):
    """A source release queued for its Spark job: its mechanism document (content address, certified ε, what its row
    shows: :func:`summary_digest`) and the input splits its job pins (which decide each partition's noise stream).
    The job runs exactly this, and the release becomes available only as this fact says — so that no row or job
    edited while it waits makes it run another mechanism or draw again (issue 40's thirty-fifth review: an ε=8
    document run for an ε=1 charge; the thirty-sixth: other splits re-drew an available release)."""

    event: Literal["release_document"] = "release_document"
    release_id: str
    mechanism_hash: str
    certified_epsilon: float | None
    summary_sha256: str
    max_partition_bytes: int
    min_partitions: int


class LabelsFact(_Fact):
    """A label version uploaded: its file (bytes, SHA-256), its examples and the registry after it, and its
    coverage set's hash — what releases of it read, so that a rewritten label file is found."""

    event: Literal["labels"] = "labels"
    version: int
    file_bytes: int
    file_sha256: str
    num_examples: int
    registry_end: int
    coverage_sha256: str
    id_bytes: int | None = None  # its ids' UTF-8 bytes, which releases' storage estimates read (None: before)


class SourceFact(_Fact):
    """A source dataset registered: its snapshot (the copy Spark counted and its releases read: location and
    fingerprint), the counts file its releases plan from (bytes, SHA-256) and its rows — so that no row edit makes
    a release read another dataset's copy, plan from other counts or charge fewer examples than it reads."""

    event: Literal["source"] = "source"
    snapshot: str
    source_sha256: str
    counts_file: str
    counts_bytes: int
    counts_sha256: str
    num_examples: int
    id_bytes: int | None = None  # its ids' UTF-8 bytes, which releases' storage estimates read (None: before)


AnyFact = BudgetFact | OwnerFact | DomainFact | GrantFact | AllocationFact | KeyFact | DocumentFact | ReleaseFact | \
    SummaryFact | LabelsFact | SourceFact
Fact = Annotated[AnyFact, Field(discriminator="event")]
_FACT = TypeAdapter(Fact)


def read_fact(record: dict[str, Any]) -> AnyFact:
    """A stored fact (raises pydantic's ValidationError on a record that is none)."""
    return _FACT.validate_python(record)


UNNAMED = "(unrecorded)"  # the organization of a record written before records named their actor


@dataclass(frozen=True)
class RecordSummary:
    """What the console and reports read from a stored record — the one place that reads a record's fields, in
    every shape the ledger has written (records before actors, accounts or exact units included)."""

    release_id: str
    org: str  # who the release went to (UNNAMED for records that did not say)
    mechanism: str
    charged_units: int  # on its own, at the record's δ
    examples_covered: int
    created_at: datetime | None
    account: str  # the account it was charged to ("" before per-organization accounts)
    spent_max_after_units: int | None  # the account's largest per-example spent after it (None: not recorded)

    @classmethod
    def of(cls, record: dict[str, Any]) -> RecordSummary:
        created = record.get("created_at")
        return cls(str(record["release_id"]), str((record.get("actor") or {}).get("org") or UNNAMED),
                   str(record.get("mechanism") or UNNAMED), charged_units(record),
                   int(record.get("examples_covered") or 0),
                   datetime.fromisoformat(created) if isinstance(created, str) else None,
                   str((record.get("account") or {}).get("org") or ""),
                   int(record["spent_max_after_units"]) if record.get("spent_max_after_units") is not None else None)


class RecordFields(BaseModel):
    """What the caller of :meth:`Ledger.charge` says about a charge; the ledger adds the rest of the record."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    release_id: str
    created_at: str
    actor: Actor
    mechanism: str
    request: dict[str, Any]
    label_version: int
    prior_epsilon: float | None = None


@dataclass(frozen=True)
class Charged:
    """A charge made (not yet committed): its record, what it charged each covered example on its own (ε units at
    the account's δ), and the budget files it superseded (to remove once the caller committed)."""

    record: LedgerRecord
    standalone_units: int
    superseded: tuple[str, ...]
