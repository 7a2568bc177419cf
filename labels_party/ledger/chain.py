"""The per-dataset hash chain: the one writer of ledger rows, the budget-relevant facts it records besides charges,
and what follows every commit that moved a chain (its anchor confirmed, its head signed and exported).

**What the chain covers.** Every fact an outsider needs to recompute a dataset's budgets: its totals (ε_total,
δ_total) at creation and at every change, its owner and its label domain, grants (made, removed), each
organization's allocation whenever it is set, API keys of organizations holding an account (made, revoked), label
versions and source registrations, every release's charge (:class:`~.records.LedgerRecord`) and its availability
(its file, mechanism document and what its row shows). A new kind of fact is a model in :mod:`.records` and one
call, from the module that owns the fact, to a named method of :class:`labels_party.ledger.Ledger`
(``dataset_budget``, ``grant_made``, ``allocation``, ``key_changed``, each over :func:`record_fact`)
inside the transaction that changes it.

**Why one chain per dataset.** The dataset is the unit of budget and of locking: each append happens under the
dataset's row lock, which the release transaction already takes first — so appends never fork or lose a link, and
the lock order is the one every writer follows (dataset rows, in id order when several, then anything else). A
dataset's chain is shown to its owner's admins only (its length counts every organization's releases); a consumer
sees no chain, head or count.

**After the commit** (a session hook registered by the append, so that callers make one call): under the
dataset's lock, the anchor in the data directory is confirmed (:class:`~.books.Anchor`) and, when the service has
an audit key, the head is signed and appended to the exported log (:mod:`.signing`). Both come after the commit,
never before: an exported head is always one the database had. A process that dies in between exports nothing
for that commit; the next commit's head covers it.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic import ValidationError
from sqlalchemy import event, select
from sqlalchemy.orm import Session

from labels_party.ledger.charges import charged_units
from labels_party.ledger.records import (
    AllocationFact,
    BudgetFact,
    DocumentFact,
    DomainFact,
    Entry,
    GrantFact,
    KeyFact,
    LabelsFact,
    OwnerFact,
    ReleaseFact,
    SourceFact,
    SummaryFact,
    _Fact,
    canonical,
    chain_hash,
    domain_digest,
    is_release,
    read_fact,
    secret_digest,
    summary_digest,
)
from labels_party.store import db

if TYPE_CHECKING:
    from labels_party.ledger.signing import HeadSigner


class LedgerAnchors(Protocol):
    """What the chain needs of :class:`labels_party.ledger.Ledger` (which calls into this module): its anchors in
    the data directory and its audit key."""

    signer: HeadSigner | None

    def anchor(self, dataset: db.Dataset, previous: tuple[int, str] | None = None) -> None: ...

    def confirm(self, dataset: db.Dataset) -> None: ...

    def facts(self, session: Session, dataset: db.Dataset) -> Replayed: ...

    def key_honoured(self, key: db.ApiKey, org: str) -> bool: ...

log = logging.getLogger("labeldp.labels")

_PENDING = "labeldp_ledger_moved"  # session.info: the datasets whose chains this transaction moved


def append(ledger: LedgerAnchors, session: Session, dataset: db.Dataset, record: dict[str, Any],
           release_id: str | None = None) -> tuple[int, str]:
    """Append ``record`` (its ``seq`` already the dataset's next) to ``dataset``'s chain; the caller holds the
    dataset's row lock. The only place a ledger row is written. Returns (seq, hash)."""
    seq = dataset.ledger_seq + 1
    if record.get("seq") != seq:
        raise ValueError(f"a record for seq {seq} says {record.get('seq')}")
    record_json = canonical(record)
    digest = chain_hash(dataset.ledger_head, record_json)
    session.add(db.LedgerEntry(dataset_id=dataset.id, seq=seq, release_id=release_id, record=record_json,
                               prev_hash=dataset.ledger_head, hash=digest))
    # The head before this transaction (not before this append: a transaction may append several facts, and if
    # its commit fails the database stays where it was before all of them).
    moved = _moved(ledger, session)
    previous = moved[dataset.id][0] if dataset.id in moved else (dataset.ledger_seq, dataset.ledger_head)
    moved[dataset.id] = (previous, (seq, digest))  # what this transaction's exported transition will say
    dataset.ledger_seq, dataset.ledger_head = seq, digest
    # Before the commit, so that the data directory never lags the database: a database later found behind
    # this anchor (and its predecessor) was restored from an older backup.
    ledger.anchor(dataset, previous)
    return seq, digest


def record_fact(ledger: LedgerAnchors, session: Session, dataset: db.Dataset, fact: _Fact) -> None:
    """Append a fact to ``dataset``'s chain (the caller holds its row lock, or made the row in this transaction)."""
    session.flush()  # the dataset row exists before a ledger row names it
    filled = fact.model_copy(update={"seq": dataset.ledger_seq + 1, "dataset_id": dataset.id,
                                     "created_at": db.utcnow().isoformat()})
    append(ledger, session, dataset, filled.model_dump(mode="json"))


def owner(ledger: LedgerAnchors, session: Session, dataset: db.Dataset) -> None:
    org = session.get(db.Organization, dataset.owner_org_id)
    assert org is not None  # the dataset's row was just made by this organization's key
    record_fact(ledger, session, dataset, OwnerFact(org=org.name, central_training=dataset.allow_central_training,
                                                    source=dataset.source_uri))


def domain(ledger: LedgerAnchors, session: Session, dataset: db.Dataset) -> None:
    record_fact(ledger, session, dataset, DomainFact(label_kind=dataset.label_kind,
                                                     domain_sha256=domain_digest(dataset.domain_json)))


def budget(ledger: LedgerAnchors, session: Session, dataset: db.Dataset, change: str) -> None:
    record_fact(ledger, session, dataset, BudgetFact(change=change, epsilon_total_units=dataset.epsilon_total_units,
                                                     delta_total=dataset.delta_total))


def grant(ledger: LedgerAnchors, session: Session, dataset: db.Dataset, org: db.Organization, change: str) -> None:
    record_fact(ledger, session, dataset, GrantFact(change=change, org=org.name))


def allocation(ledger: LedgerAnchors, session: Session, dataset: db.Dataset, account: db.BudgetAccount) -> None:
    org = session.get(db.Organization, account.org_id)
    record_fact(ledger, session, dataset, AllocationFact(org=org.name if org else "?",
                                                        epsilon_units=account.epsilon_units, delta=account.delta))


def org_keys(ledger: LedgerAnchors, session: Session, dataset: db.Dataset, org_id: int) -> None:
    """An organization's account opened on ``dataset``: its keys not yet revoked, made before, go on the chain (a
    key charges or administers a dataset only once its chain knows it). The caller holds the dataset's row lock."""
    known = ledger.facts(session, dataset).keys
    now = db.utcnow()
    org = session.get(db.Organization, org_id)
    for api_key in session.scalars(select(db.ApiKey).where(db.ApiKey.org_id == org_id).order_by(db.ApiKey.id)):
        if org is not None and not ledger.key_honoured(api_key, org.name):
            log.warning("key %s of %s is not as the service issued it (no valid certificate): not chained",
                        api_key.id, org.name)
            continue
        if api_key.id not in known and api_key.status(now) != "revoked":
            record_fact(ledger, session, dataset, KeyFact(change="created", org=org.name if org else "?",
                                                          role=api_key.role, key_prefix=api_key.prefix,
                                                          key_id=api_key.id,
                                                          secret_digest=secret_digest(api_key.key_hash)))
            if api_key.revoked_at is not None:  # rotating: refused from its grace's end, which the chain says too
                record_fact(ledger, session, dataset, KeyFact(
                    change="revoked", org=org.name if org else "?", role=api_key.role, key_prefix=api_key.prefix,
                    key_id=api_key.id, revoked_at=api_key.revoked_at.isoformat(), revoked_by=api_key.revoked_by))


def key(ledger: LedgerAnchors, session: Session, api_key: db.ApiKey, change: Literal["created", "revoked"],
        org: db.Organization) -> int:
    """A key of ``org`` made or revoked, on the chain of every dataset that organization holds an account on
    (locked in id order, the one order of several dataset locks). Returns how many chains it went to."""
    datasets = session.scalars(
        select(db.Dataset).join(db.BudgetAccount, db.BudgetAccount.dataset_id == db.Dataset.id)
        .where(db.BudgetAccount.org_id == org.id).order_by(db.Dataset.id)
        .with_for_update(of=db.Dataset)).unique().all()
    for dataset in datasets:
        revoked_at = api_key.revoked_at if change == "revoked" else None
        record_fact(ledger, session, dataset, KeyFact(
            change=change, org=org.name, role=api_key.role, key_prefix=api_key.prefix,
            key_id=api_key.id, revoked_at=revoked_at.isoformat() if revoked_at is not None else None,
            revoked_by=api_key.revoked_by if revoked_at is not None else None,
            secret_digest=secret_digest(api_key.key_hash) if change == "created" else None))
    return len(datasets)


def release_available(ledger: LedgerAnchors, session: Session, dataset: db.Dataset, release: db.Release) -> None:
    """``release`` is available (its file's size and hash, its mechanism document, set on the row): the caller
    holds the dataset's row lock."""
    assert release.file_size is not None and release.file_sha256 is not None and release.mechanism_hash is not None
    session.flush()
    filled = ReleaseFact(seq=dataset.ledger_seq + 1, dataset_id=dataset.id, created_at=db.utcnow().isoformat(),
                         release_id=release.id, file_bytes=release.file_size, file_sha256=release.file_sha256,
                         mechanism_hash=release.mechanism_hash, certified_epsilon=release.certified_epsilon,
                         summary_sha256=shown_summary(release))
    append(ledger, session, dataset, filled.model_dump(mode="json"), release.id)


def release_document(ledger: LedgerAnchors, session: Session, dataset: db.Dataset, release: db.Release,
                     splits: tuple[int, int]) -> None:
    """``release`` queued for its job (its row holds its document; ``splits``: the job's max partition bytes and
    min partitions): the caller holds the dataset's row lock."""
    assert release.mechanism_hash is not None
    session.flush()
    filled = DocumentFact(seq=dataset.ledger_seq + 1, dataset_id=dataset.id, created_at=db.utcnow().isoformat(),
                          release_id=release.id, mechanism_hash=release.mechanism_hash,
                          certified_epsilon=release.certified_epsilon, summary_sha256=shown_summary(release),
                          max_partition_bytes=splits[0], min_partitions=splits[1])
    append(ledger, session, dataset, filled.model_dump(mode="json"), release.id)


def shown_summary(release: db.Release) -> str:
    """The digest of what ``release``'s row shows besides its record (:func:`.records.summary_digest`)."""
    return summary_digest(release.description_json, release.prior_json, release.prior_epsilon,
                          release.randomizer_epsilon)


def labels(ledger: LedgerAnchors, session: Session, dataset: db.Dataset, version: db.LabelVersion,
           file: tuple[int, str]) -> None:
    """A label version uploaded (``file``: its bytes and SHA-256); the caller holds the dataset's row lock."""
    record_fact(ledger, session, dataset, LabelsFact(
        version=version.version, file_bytes=file[0], file_sha256=file[1], num_examples=version.num_examples,
        registry_end=version.registry_end, coverage_sha256=version.coverage_sha256, id_bytes=version.id_bytes))


def source(ledger: LedgerAnchors, session: Session, dataset: db.Dataset, counts: tuple[int, str]) -> None:
    """A source dataset registered (its snapshot, fingerprint, counts file and rows set on the row; ``counts``: that
    file's bytes and SHA-256); the caller holds the dataset's row lock."""
    assert dataset.source_snapshot is not None and dataset.source_sha256 is not None
    assert dataset.source_counts_file is not None
    record_fact(ledger, session, dataset, SourceFact(
        snapshot=dataset.source_snapshot, source_sha256=dataset.source_sha256, counts_file=dataset.source_counts_file,
        counts_bytes=counts[0], counts_sha256=counts[1], num_examples=dataset.num_examples,
        id_bytes=dataset.source_id_bytes))


def moving(session: Session, dataset_id: str) -> bool:
    """Whether ``session``'s transaction has appended to ``dataset_id``'s chain (not yet committed)."""
    return dataset_id in session.info.get(_PENDING, {})


def _moved(ledger: LedgerAnchors, session: Session) -> dict[str, tuple[tuple[int, str], tuple[int, str]]]:
    """The datasets whose chains ``session``'s transaction moved, with their heads before it and after it; on its
    first use in a session, registers what happens when the transaction commits (:func:`_committed`) or rolls
    back."""
    moved = session.info.get(_PENDING)
    if moved is None:
        moved = session.info[_PENDING] = {}
        event.listen(session, "after_commit", lambda committed: _committed(ledger, committed))
        event.listen(session, "after_rollback", lambda rolled: rolled.info.get(_PENDING, {}).clear())
    return moved


def _committed(ledger: LedgerAnchors, session: Session) -> None:
    moved = sorted(session.info.get(_PENDING, {}).items())
    session.info.get(_PENDING, {}).clear()
    if not moved:
        return
    bind = session.get_bind()
    for dataset_id, (previous, written) in moved:
        try:  # under the dataset's lock: a later charge's pending anchor is never overwritten by this older head
            with Session(bind=bind) as fresh, fresh.begin():
                dataset = fresh.get(db.Dataset, dataset_id, with_for_update=True)
                if dataset is None:
                    continue
                ledger.confirm(dataset)
                if ledger.signer is not None:  # exactly what this transaction wrote, never the table's head now
                    ledger.signer.export(ledger.signer.sign(dataset.id, written[0], written[1], previous=previous))
        except Exception:  # noqa: BLE001 - committed: the pending anchor stands, the next commit exports its head
            log.warning("could not confirm or export the ledger head of dataset %s", dataset_id, exc_info=True)


@dataclass
class Replayed:
    """What a dataset's chain says now stands, replayed fact by fact up to ``seq`` (whose hash is ``head``): totals
    (None: the chain records none), the owner, grants, allocations (organization name -> (ε units, δ)), keys made (id ->
    (organization, role, prefix)) and revoked (id -> (prefix, from when: ISO time, or None in facts before
    revocations carried it)), the releases charged (release id -> standalone units; -> the organization charged,
    for records that name it; those whose availability a :class:`ReleaseFact` must state), the releases made
    available and what their rows show, the label domain, the label versions uploaded, the source registered, and
    what in the chain itself is inconsistent."""

    seq: int = 0
    head: str = "0" * 64
    totals: tuple[int, float] | None = None
    owner: OwnerFact | None = None  # None: a chain from before owners were chained
    domain: DomainFact | None = None  # None: only while the transaction that creates the dataset appends its facts
    grants: set[str] = field(default_factory=set)
    allocations: dict[str, tuple[int, float]] = field(default_factory=dict)
    keys: dict[int, tuple[str, str, str]] = field(default_factory=dict)
    secrets: dict[int, str] = field(default_factory=dict)  # key id -> its secret's digest, where recorded
    spent_states: dict[str, dict[str, Any]] = field(default_factory=dict)  # org -> its last charge's SpentState
    revoked: dict[int, tuple[str, str | None]] = field(default_factory=dict)
    releases: dict[str, int] = field(default_factory=dict)
    charged_orgs: dict[str, str] = field(default_factory=dict)
    # release id -> what its record says of it: (mechanism, ε requested, examples covered, label version, the prior's
    # part of ε and the randomizer's), each None if unsaid
    shown: dict[str, tuple[str | None, float | None, int | None, int | None, float | None, float | None]] = field(
        default_factory=dict)
    documents: dict[str, DocumentFact] = field(default_factory=dict)  # release id -> its document stated early
    files_on_chain: set[str] = field(default_factory=set)
    available: dict[str, ReleaseFact] = field(default_factory=dict)
    summaries: dict[str, str] = field(default_factory=dict)  # release id -> its shown summary's digest
    labels: dict[int, LabelsFact] = field(default_factory=dict)
    source: SourceFact | None = None
    # whether the accounts may be rebuilt from the records (labels_party.ledger.budgets.rebuild_migrated): only
    # right after the migration to accounts, whose chain ends with its one budget fact (``migrated``) and the
    # grants, allocations and owner facts it appended — the rebuild appends ``changed`` totals, so it happens once
    rebuild_pending: bool = False
    problems: list[str] = field(default_factory=list)


def replay(entries: Sequence[Entry], start: Replayed | None = None) -> Replayed:
    """Replay a dataset's chain (in order), from its beginning or continuing ``start`` (left unchanged) with the
    entries after it. A release's record must agree with the facts before it: the totals and its organization's
    allocation it states are the ones then in force (when the chain had recorded them: records older than facts
    are checked against their own)."""
    out = copy.deepcopy(start) if start is not None else Replayed()
    for entry in entries:
        out.seq, out.head = entry.seq, entry.hash
        record = entry.record
        if is_release(record):
            out.rebuild_pending = False
            _replay_release(out, entry.seq, record)
            continue
        try:
            fact = read_fact(record)
        except ValidationError:
            out.problems.append(f"seq {entry.seq}: a record that is neither a release nor a known fact")
            continue
        if not isinstance(fact, (GrantFact, AllocationFact, OwnerFact, DomainFact, SummaryFact)):
            out.rebuild_pending = isinstance(fact, BudgetFact) and fact.change == "migrated" and out.totals is None
        if isinstance(fact, BudgetFact):
            out.totals = (fact.epsilon_total_units, fact.delta_total)
        elif isinstance(fact, OwnerFact):
            if out.owner is not None:
                out.problems.append(f"seq {entry.seq}: a second owner")
            out.owner = fact
        elif isinstance(fact, DomainFact):
            if out.domain is not None:
                out.problems.append(f"seq {entry.seq}: a second domain")
            out.domain = fact
        elif isinstance(fact, GrantFact):
            (out.grants.discard if fact.change == "removed" else out.grants.add)(fact.org)
        elif isinstance(fact, AllocationFact):
            out.allocations[fact.org] = (fact.epsilon_units, fact.delta)
        elif isinstance(fact, (ReleaseFact, DocumentFact, SummaryFact)):
            _replay_release_fact(out, entry.seq, fact)
        elif isinstance(fact, LabelsFact):
            out.labels[fact.version] = fact
        elif isinstance(fact, SourceFact):
            if out.source is not None or out.labels:
                out.problems.append(f"seq {entry.seq}: a source registered twice, or on a dataset of uploads")
            out.source = fact
        elif fact.change == "revoked":
            out.revoked[fact.key_id] = (fact.key_prefix, fact.revoked_at)
        else:
            out.keys[fact.key_id] = (fact.org, fact.role, fact.key_prefix)
            if fact.secret_digest is not None:
                out.secrets[fact.key_id] = fact.secret_digest
    return out


def _replay_release_fact(out: Replayed, seq: int, fact: ReleaseFact | DocumentFact | SummaryFact) -> None:
    """A charged release's document stated (before its job), its availability, or its summary (migration 0022)."""
    if isinstance(fact, ReleaseFact):
        if fact.release_id not in out.releases or fact.release_id in out.available:
            out.problems.append(f"seq {seq}: release {fact.release_id} made available without a charge, or twice")
        out.available[fact.release_id] = fact
        if fact.summary_sha256 is not None:
            out.summaries[fact.release_id] = fact.summary_sha256
    elif isinstance(fact, DocumentFact):
        if fact.release_id not in out.releases or fact.release_id in out.documents or \
                fact.release_id in out.available:
            out.problems.append(f"seq {seq}: release {fact.release_id}'s document stated without a charge, twice, "
                                "or after its availability")
        out.documents[fact.release_id] = fact
    else:
        if fact.release_id not in out.releases or fact.release_id in out.summaries:
            out.problems.append(f"seq {seq}: release {fact.release_id}'s summary stated without a charge, or twice")
        out.summaries[fact.release_id] = fact.summary_sha256


def _replay_release(out: Replayed, seq: int, record: dict[str, Any]) -> None:
    release_id = str(record.get("release_id"))
    if release_id in out.releases:
        out.problems.append(f"seq {seq}: release {release_id} charged twice")
    out.releases[release_id] = charged_units(record)
    actor = record.get("actor") or {}
    if actor.get("org"):
        out.charged_orgs[release_id] = str(actor["org"])
    if record.get("file_on_chain"):
        out.files_on_chain.add(release_id)
    requested, prior = record.get("epsilon_requested"), record.get("prior_epsilon")
    out.shown[release_id] = (record.get("mechanism"), requested, record.get("examples_covered"),
                             record.get("label_version"), prior,
                             requested - prior if requested is not None and prior is not None else None)
    if out.totals is not None and "epsilon_total_units" in record and \
            (record["epsilon_total_units"], record.get("delta_total", 0.0)) != out.totals:
        out.problems.append(f"seq {seq}: the record's dataset totals are not the chain's")
    account = record.get("account") or {}
    if record.get("spent_state") is not None:
        out.spent_states[str(account.get("org"))] = record["spent_state"]
    terms = out.allocations.get(str(account.get("org")))
    if terms is not None and (account.get("epsilon_units"), account.get("delta")) != terms:
        out.problems.append(f"seq {seq}: the record's allocation is not the one the chain set")
