"""``labeldp labels verify-audit``: everything the ledger claims, recomputed from its records alone, and — given
signed heads pinned earlier — proof that the database was not rewritten or truncated since.

Per dataset, in one consistent snapshot (PostgreSQL: a read-only REPEATABLE READ transaction, so a running
service may keep charging): the hash chain; the heads pinned (each signed by the audit key, contained in the chain
at its position) and the data directory's anchor (read before the snapshot: the chain must contain what it saw);
the chain's facts replayed against the tables — totals, grants, every organization's allocation, revoked keys (and
no release charged by a key after its revocation's fact took effect), one release row per charged release and no
other; per record, its (ε, δ) from its ``dp_event`` (a pure event's ε at most its exact charge, compared in integer
units; an event with δ > 0 charged exactly the RDP curve the accountant gives it), its coverage file against its
hash and the registry, and its release (an available release's mechanism document exists and certifies at most what
was charged, its file is the one recorded when it became available); per organization's account, every example's
spent state recomputed from that organization's records and compared exactly with the stored classes, and its use
within its allocation; per example, the total over the accounts within the dataset's (ε_total, δ_total). A missing
or damaged file is reported, never raised; so is a damaged ledger row (not JSON, not an object, a release record
without what its checks read): "seq N: record damaged: …", and the dataset's other rows, and the other datasets,
are still checked.

A budget file the snapshot names may have been superseded — and removed — by a charge that committed after the
snapshot began: that dataset is checked again in a fresh snapshot (a file still named by the newest state and
unreadable is reported).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from labels_party.ledger import (
    AccountState,
    Anchor,
    Charge,
    Entry,
    Ledger,
    Replayed,
    SignedHead,
    canonical,
    chain_intact,
    charged_units,
    documents,
    entries,
    is_release,
    key_certificates,
    rdp_curve,
    recorded_coverage,
    records_by_org,
    replay,
    units_epsilon,
    within_charge,
)
from labels_party.ledger.agreement import table_problems
from labels_party.store import db, labelstore
from shared.domains import ContinuousInterval, domain_from_spec
from shared.errors import LabelDPError
from shared.mechanisms import events
from shared.mechanisms.documents import sampler_from_description

log = logging.getLogger("labeldp.labels")

ATTEMPTS = 20  # fresh snapshots of one dataset whose budget files kept changing under the audit
# How often a chain with entries no exported transition covers yet is looked at again, 0.25 s apart: a
# head is exported right after its commit, so a live service's lag is milliseconds; entries still unsigned after
# 3 s were written by someone else (or by a process that died between its commit and its export).
UNSIGNED_WAITS = 12
_STATE_ERRORS = (OSError, ValueError, EOFError)  # a file gone, or cut short / not an array


class _Changed(Exception):
    """A budget file the snapshot names is gone because a later charge superseded it: check again."""


def verify(sessions: sessionmaker, ledger: Ledger, dataset_id: str | None = None, *,
           pinned: Sequence[SignedHead] | None = None, public_key: Ed25519PublicKey | None = None,
           heads_log: Callable[[], Sequence[SignedHead]] | None = None,
           max_document_bytes: int = documents.DEFAULT_MAX_BYTES) -> dict:
    """Every dataset's (or only ``dataset_id``'s) chain, facts, records, files and accounts, recomputed; with
    ``pinned`` heads (and the ``public_key`` they are signed with), each checked against its dataset's chain; with
    ``heads_log`` (reads the service's whole export of signed transitions), every entry since signing began must be
    covered by a transition the service signed: an entry appended by anyone else is found, even after later
    signed heads. ``max_document_bytes``: the service's (what bounds every mechanism document a release creates).
    """
    # Read before any snapshot: every head exported and every anchor written was committed before, or is at most
    # one pending charge ahead, so a snapshot taken afterwards must contain what they say.
    heads: dict[str, list[SignedHead]] = {}
    for head in pinned or ():
        heads.setdefault(head.dataset_id, []).append(head)
    exported: dict[str, list[SignedHead]] | None = None
    if heads_log is not None:  # read once; again only for a dataset whose newest entries are not exported yet
        exported = {}
        for head in heads_log():
            exported.setdefault(head.dataset_id, []).append(head)
    anchors = {name: ledger.read_anchor(name) for name in ledger.anchored_datasets()}
    with sessions() as session, session.begin():
        query = select(db.Dataset.id).order_by(db.Dataset.created_at)
        if dataset_id is not None:
            query = query.where(db.Dataset.id == dataset_id)
        ids = list(session.scalars(query))
    checked = _Documents(max_document_bytes)
    datasets = [_verify_dataset(sessions, ledger, name, anchors.get(name), heads.get(name, []), public_key,
                                None if exported is None else exported.get(name, []), heads_log, checked)
                for name in ids]
    valid = all(not d["problems"] for d in datasets)
    report: dict[str, Any] = {"datasets": datasets, "valid": valid}
    missing = sorted(name for name in set(anchors) - set(ids) if not ledger.uncommitted_creation(name)) \
        if dataset_id is None else []
    problems = [f"dataset {name} has an anchor in the data directory but is not in the database"
                for name in missing]  # the data directory anchored a dataset the database does not have
    if dataset_id is None:  # keys in force that the service did not issue as they are, or revoked
        problems += _keys_in_force_wrongly(sessions, ledger, public_key)
    if exported is not None and dataset_id is None:  # the service signed heads of a dataset the database lost
        problems += [f"dataset {name} has signed heads in the heads log but is not in the database"
                     for name in sorted(set(exported) - set(ids))]
    if problems:
        report["problems"] = problems
        report["valid"] = False
    if pinned is not None:
        gone = sorted({h.dataset_id for h in pinned} - set(ids)) if dataset_id is None else []
        report["pinned"] = {"heads": len(pinned), "problems": [
            f"dataset {name} has pinned heads but is not in the database" for name in gone]}
        report["valid"] &= not gone
    return report


def _keys_in_force_wrongly(sessions: sessionmaker, ledger: Ledger, public_key: Ed25519PublicKey | None) -> list[str]:
    """Keys in force whose rows are not what their certificates state (with the public key), or that the data
    directory's revocations name (:mod:`labels_party.ledger.revocations`: a row and certificate put back after the
    revocation). A revoked key acts on nothing."""
    now = db.utcnow()
    with sessions() as session:
        rows = session.execute(select(db.ApiKey, db.Organization.name)
                               .join(db.Organization, db.Organization.id == db.ApiKey.org_id)).all()
        problems = []
        for key, org in rows:
            if not key.in_force(now):
                continue
            if ledger.key_revoked(key):
                problems.append(f"key {key.prefix} of {org} is in force in the database but was revoked (the data "
                                "directory's revocations name it)")
            elif public_key is not None and not key_certificates.agrees(public_key, key, org):
                problems.append(f"key {key.prefix} of {org} is in force but not as the service issued it (no valid "
                                "certificate)")
        return problems


def _verify_dataset(sessions: sessionmaker, ledger: Ledger, dataset_id: str, anchor: Anchor | None,
                    heads: list[SignedHead], public_key: Ed25519PublicKey | None,
                    exported: list[SignedHead] | None, heads_log: Callable[[], Sequence[SignedHead]] | None,
                    checked: _Documents) -> dict:
    """``exported``: this dataset's heads in the log, read before any snapshot (like the pinned heads); the log is
    read again only when a snapshot's newest entries are not exported yet (a head is exported just after its
    commit)."""
    unsigned_waits = 0
    for attempt in range(ATTEMPTS):
        try:
            with sessions() as session, session.begin():
                _snapshot(session)
                report = _check(session, sessions, ledger, dataset_id, anchor, heads, public_key, exported, checked)
        except _Changed:
            time.sleep(0.01 * attempt)  # let the charges in flight commit: the next snapshot opens their files
            continue
        except Exception as error:  # noqa: BLE001 - damage no check foresaw: this dataset fails, the others are
            # still verified (the stack goes to the log, the report names the error only)
            log.warning("verify-audit could not check dataset %s", dataset_id, exc_info=True)
            return {"dataset_id": dataset_id, "problems": [
                f"it could not be checked: {type(error).__name__}: {str(error)[:200]}"]}
        if report.pop("unsigned_entries", False) and unsigned_waits < UNSIGNED_WAITS and heads_log is not None:
            unsigned_waits += 1
            time.sleep(0.25)
            exported = [h for h in heads_log() if h.dataset_id == dataset_id]
            continue
        return report
    return {"dataset_id": dataset_id, "problems": [
        f"its budget files changed under each of {ATTEMPTS} snapshots; run verify-audit again"]}


def _snapshot(session: Session) -> None:
    """PostgreSQL: this transaction reads one snapshot and writes nothing (SQLite's transactions are already
    serialized: see shared.service.database)."""
    if session.get_bind().dialect.name == "postgresql":
        session.connection(execution_options={"isolation_level": "REPEATABLE READ", "postgresql_readonly": True})


def _check(session: Session, sessions: sessionmaker, ledger: Ledger, dataset_id: str, anchor: Anchor | None,
           heads: list[SignedHead], public_key: Ed25519PublicKey | None,
           exported: list[SignedHead] | None, checked: _Documents) -> dict:
    dataset = session.get(db.Dataset, dataset_id)
    if dataset is None:  # datasets are never deleted: it was listed a moment ago
        return {"dataset_id": dataset_id, "problems": ["the dataset row is gone"]}
    # The budget files first: a charge that commits after the snapshot began removes the files it superseded, so
    # the snapshot's are opened before anything slow is read (an opened file stays readable).
    accounts = session.scalars(select(db.BudgetAccount).where(db.BudgetAccount.dataset_id == dataset.id)
                               .order_by(db.BudgetAccount.id)).all()
    states = _open_states(session, sessions, ledger, dataset, accounts)
    names = {o.id: o.name for o in session.scalars(select(db.Organization))}
    stored = entries(session, dataset.id)
    problems: list[str] = []
    if not chain_intact(stored, dataset.ledger_head):
        problems.append("hash chain broken")
    problems += _anchor_problems(ledger, dataset, stored, anchor)
    problems += _pinned_problems(stored, heads, public_key)
    unsigned_entries = False
    if exported is not None:
        signed, unsigned_entries = _signed_coverage(stored, exported, public_key)
        problems += signed
    damaged = {entry.seq: _damage(entry) for entry in stored}
    problems += [f"seq {seq}: record damaged: {why}" for seq, why in damaged.items() if why is not None]
    chain = [entry for entry in stored if damaged[entry.seq] is None]  # what the checks below can read
    replayed = replay(chain)
    problems += replayed.problems
    problems += table_problems(session, dataset, replayed, names)
    problems += _revoked_key_problems(chain)
    releases = {r.id: r for r in session.scalars(select(db.Release).where(db.Release.dataset_id == dataset.id))}
    records, orgs = records_by_org(session, chain) if not (replayed.releases.keys() - releases.keys()) \
        else ([e.record for e in chain if e.is_release], None)
    for entry in (e for e in chain if e.is_release):
        problems += _record_problems(ledger, session, dataset, entry, checked)
    for release in sorted(releases.values(), key=lambda r: r.id):
        problems += _file_problems(ledger, release)
    problems += _label_file_problems(session, ledger, dataset, replayed)
    account_problems, worst = _account_problems(ledger, dataset, accounts, states, names, records, orgs)
    problems += account_problems
    return {"dataset_id": dataset.id, "name": dataset.name, "entries": len(stored),
            "releases": len(replayed.releases), "seq": dataset.ledger_seq, "head": dataset.ledger_head,
            "epsilon_spent": units_epsilon(worst), "epsilon_total": units_epsilon(dataset.epsilon_total_units),
            "delta_total": dataset.delta_total, "problems": problems, "unsigned_entries": unsigned_entries}


def _account_problems(ledger: Ledger, dataset: db.Dataset, accounts: Sequence[db.BudgetAccount],
                      states: Sequence[AccountState | None], names: dict[int, str], records: list[dict],
                      orgs: list[int] | None) -> tuple[list[str], int]:
    """Each account's budget state against its releases' records (when every release row exists) and its
    allocation, and the dataset's totals against its accounts'; (problems, the most any example spent, in units).
    """
    problems: list[str] = []
    for account, state in zip(accounts, states, strict=True):
        who = names.get(account.org_id, "?")
        if state is None:
            problems.append(f"{who}: its budget state file is missing or damaged")
            continue
        if orgs is not None:
            own = [r for r, org in zip(records, orgs, strict=True) if org == account.org_id]
            problems += [f"{who}: {p}" for p in ledger.differences(dataset, account, own, state)]
        if account.spent_max_units > account.epsilon_units:
            problems.append(f"{who} spent more than its allocation")
    worst = 0
    if all(state is not None for state in states):
        try:
            opened = [state for state in states if state is not None]
            totals, _counts = ledger.spent_by_example(accounts, dataset.registry_size, opened)
            worst = int(totals.max()) if totals.size else 0
        except _STATE_ERRORS:
            problems.append("the per-example totals cannot be read from the budget files")
    if worst > dataset.epsilon_total_units:
        problems.append("an example exceeds the dataset's total budget")
    if sum(a.delta for a in accounts if a.rdp_file) > dataset.delta_total * (1 + 1e-12):
        problems.append("the organizations' delta exceeds the dataset's")
    if dataset.epsilon_spent_units != sum(a.spent_max_units for a in accounts):
        problems.append("the dataset's spent epsilon differs from its accounts'")
    return problems, worst


def _signed_coverage(chain: Sequence[Entry], exported: Sequence[SignedHead],
                     public_key: Ed25519PublicKey | None) -> tuple[list[str], bool]:
    """Problems with the chain against the service's exported transitions, and whether the only ones are entries
    that no transition covers yet: a head is exported just after its commit, and under concurrent charges a later
    commit's head can be exported before an earlier one's, so such gaps may be anywhere near the end and are looked
    at again. Entries before the first transition were written before the audit key was configured (or by a
    migration) and are only checked by the hash chain."""
    transitions = [h for h in exported if h.transition]
    if public_key is None:
        return (["the audit log cannot be checked without the audit public key"] if transitions else []), False
    problems, covered = [], [False] * (len(chain) + 1)  # covered[seq]
    start = None
    for head in transitions:
        assert head.previous_seq is not None and head.previous_head is not None  # a transition
        if not head.signed_by(public_key):
            problems.append(f"exported head at seq {head.seq}: not signed by the audit key")
        elif not (_contains(chain, head.previous_seq, head.previous_head) and _contains(chain, head.seq, head.head)):
            problems.append(f"exported transition seq {head.previous_seq}→{head.seq}: the chain no longer contains "
                            f"it (rewritten or truncated: it has {len(chain)} entries)")
        else:
            start = head.previous_seq if start is None else min(start, head.previous_seq)
            for seq in range(head.previous_seq + 1, head.seq + 1):
                covered[seq] = True
    first = 1 if start is None else start + 1  # a chain never signed at all: every entry is unsigned
    gaps = _ranges([seq for seq in range(first, len(chain) + 1) if not covered[seq]])
    if not gaps:
        return problems, False
    only_gaps = not problems
    for low, high in gaps:
        problems.append(f"entries {low}–{high} are covered by no head the service signed and exported (written "
                        "outside the service, or by a process that died between its commit and its export)")
    return problems, only_gaps


def _ranges(seqs: Sequence[int]) -> list[tuple[int, int]]:
    ranges: list[tuple[int, int]] = []
    for seq in seqs:
        if ranges and ranges[-1][1] == seq - 1:
            ranges[-1] = (ranges[-1][0], seq)
        else:
            ranges.append((seq, seq))
    return ranges


def _damage(entry: Entry) -> str | None:
    """Why a stored row cannot be checked (None: it can): it is not a JSON object, or it is a release's record
    without what the checks read — its release id, charge, ``dp_event`` (with its ε or RDP curve), coverage file and
    hash, account. Everything a record holds was written by the service, so anything unreadable is damage, whatever
    exception reading it raises: reported as the dataset's problem, never raised (a fact's own shape is checked by
    the replay)."""
    try:
        record = json.loads(entry.record_json)
        if not isinstance(record, dict):
            return f"not a JSON object but {type(record).__name__}"
        if not is_release(record):
            return None
        canonical(record)  # its tag (a non-finite number fails here)
        if not isinstance(record["release_id"], str):
            return "release_id is not a string"
        if not isinstance(record.get("account") or {}, dict):
            return "account is not an object"
        coverage = record["coverage"]
        if not (isinstance(coverage, dict) and isinstance(coverage["file"], str) and
                isinstance(coverage["sha256"], str)):
            return "coverage is not a file and its hash"
        charge = Charge.of_record(record)
        charged_units(record)
        int(record.get("examples_covered") or 0)
        event = events.from_dict(record["dp_event"])
        if charge.rdp is None:
            float(events.epsilon_of(event))
        else:
            list(rdp_curve(event))
    except Exception as error:  # noqa: BLE001 - any unreadable record is a finding, not a crash of the audit
        return f"{type(error).__name__}: {str(error)[:200]}"
    return None


def _contains(chain: Sequence[Entry], seq: int, head: str) -> bool:
    """The chain has ``head`` at position ``seq`` (0: the empty chain's)."""
    if seq == 0:
        return head == "0" * 64
    return seq <= len(chain) and chain[seq - 1].seq == seq and chain[seq - 1].hash == head


def _anchor_problems(ledger: Ledger, dataset: db.Dataset, chain: Sequence[Entry], anchor: Anchor | None) -> list[str]:
    """The anchor read before the snapshot: the chain must contain the head it had confirmed (a pending head may
    be one whose commit failed); a dataset with a chain must have one (re-read: it may have been made since)."""
    anchor = anchor or ledger.read_anchor(dataset.id)
    if anchor is None:
        return ["the chain has entries but the data directory has no anchor for it"] if chain else []
    if not _contains(chain, anchor.previous_seq, anchor.previous_head):
        return ["the database is behind the data directory's anchor (restored from an older backup)"]
    return []


def _pinned_problems(chain: Sequence[Entry], heads: Sequence[SignedHead],
                     public_key: Ed25519PublicKey | None) -> list[str]:
    problems = []
    for head in heads:
        if public_key is None or not head.signed_by(public_key):
            problems.append(f"pinned head at seq {head.seq}: not signed by the audit key")
        elif not _contains(chain, head.seq, head.head):
            problems.append(f"pinned head at seq {head.seq}: the chain no longer contains it (rewritten or "
                            f"truncated: it has {len(chain)} entries)")
    return problems


def _revoked_key_problems(chain: Sequence[Entry]) -> list[str]:
    """No release is charged by a key whose revocation fact precedes its record on the chain (a revoked key charges
    nothing after its :class:`~labels_party.ledger.KeyFact`), unless the revocation had not yet taken effect when
    it was charged (a rotation's grace period). Records name their key from when they carry its id or prefix."""
    revoked: dict[tuple[str, object], tuple[int, str | None]] = {}  # (by id / prefix) -> (fact's seq, from when)
    problems = []
    for entry in chain:
        record = entry.record
        if not entry.is_release:
            if record.get("event") == "key" and record.get("change") == "revoked":
                when = record.get("revoked_at")
                # the newest fact stands (a revocation during a rotation's grace takes effect earlier)
                revoked[("id", record.get("key_id"))] = revoked[("prefix", record.get("key_prefix"))] = (entry.seq,
                                                                                                         when)
            continue
        actor = record.get("actor") or {}
        key = ("id", actor["key_id"]) if actor.get("key_id") is not None else ("prefix", actor.get("key_prefix"))
        if key[1] is None or key not in revoked:
            continue
        seq, when = revoked[key]
        created = record.get("created_at")
        try:
            before_effect = when is not None and isinstance(created, str) and \
                datetime.fromisoformat(created) < datetime.fromisoformat(when)
        except ValueError:
            before_effect = False
        if not before_effect:
            problems.append(f"seq {entry.seq}: key {actor.get('key_prefix') or actor.get('key_id')} charged release "
                            f"{record.get('release_id')} after its revocation at seq {seq}")
    return problems


def _record_problems(ledger: Ledger, session: Session, dataset: db.Dataset, entry: Entry,
                     checked: _Documents) -> list[str]:
    seq, record = entry.seq, entry.record
    problems = []
    charge = Charge.of_record(record)
    try:
        event = events.from_dict(record["dp_event"])
    except (KeyError, TypeError, AttributeError, ValueError):
        return [f"seq {seq}: its dp_event cannot be read"]
    if charge.rdp is None:
        epsilon = events.epsilon_of(event)
        if not within_charge(epsilon, charge.units):
            problems.append(f"seq {seq}: dp_event epsilon {epsilon!r} exceeds the charge of "
                            f"{charge.units} units")
    elif record.get("rdp_units") is not None and list(rdp_curve(event)) != list(record["rdp_units"]):
        problems.append(f"seq {seq}: the charged RDP curve is not the dp_event's")
    file = record["coverage"]["file"]
    try:  # its size first: a file of another size than the record's is not read (the thirty-ninth review's
        # sparse 2 GiB coverage file took verify 16.5 s and +6.1 GB)
        coverage = recorded_coverage(ledger.store, record, dataset.registry_size)
        last = int(coverage.slice(coverage.size - 1, coverage.size)[0]) if coverage.size else -1
    except (*_STATE_ERRORS, KeyError, TypeError):
        return problems + [f"seq {seq}: coverage file {file} (not the indices its record hashes) missing or "
                           "damaged"]
    if last >= dataset.registry_size:
        problems.append(f"seq {seq}: coverage disagrees with the examples covered or the registry")
    release = session.get(db.Release, record["release_id"])
    if release is None:
        return problems  # reported with the chain's releases
    if "mechanism_hash" in record and release.mechanism_hash != record["mechanism_hash"]:
        problems.append(f"seq {seq}: the release's mechanism document is not the one recorded")
    stored = session.get(db.MechanismDocument, release.mechanism_hash) if release.mechanism_hash else None
    if release.state == "available":
        if stored is None:
            problems.append(f"seq {seq}: mechanism document of release {release.id} missing")
            return problems
        if charge.rdp is None and not within_charge(release.certified_epsilon or 0.0, charge.units):
            problems.append(f"seq {seq}: the release's mechanism certifies more than was charged")
        problems += [f"seq {seq}: {p}" for p in _document_problems(stored, charge, checked)]
    summary = checked.check(stored).summary if stored is not None else ({}, None)  # (None: damaged, reported)
    if summary is not None and _shown_summary(release) != summary:
        # what a consumer reads of it (ε, a metric and its interval): its mechanism document's, without lists
        problems.append(f"seq {seq}: the release's shown summary is not its mechanism document's")
    return problems


def _shown_summary(release: db.Release) -> tuple[Any, Any]:
    try:
        return json.loads(release.description_json), json.loads(release.prior_json) if release.prior_json else None
    except ValueError:
        return None, None


@dataclass
class _Documents:
    """Each mechanism document's check (:func:`_document_check`), once per verify: releases share documents.
    ``max_bytes``: the service's ``max_document_bytes``, which bounds what a stored document may expand to."""

    max_bytes: int
    found: dict[str, _Checked] = field(default_factory=dict)

    def check(self, stored: db.MechanismDocument) -> _Checked:
        if stored.hash not in self.found:
            self.found[stored.hash] = _document_check(stored, self.max_bytes)
        return self.found[stored.hash]


@dataclass(frozen=True)
class _Checked:
    """A mechanism document's check: what is wrong with it (None: nothing), its mechanism's certified ε recomputed
    (None: not a mechanism its description rebuilds), and the summary a release of it shows (its description's and
    noisy prior's scalars: :func:`labels_party.ledger.documents.summary`; None if it cannot be read)."""

    damage: str | None
    certified: float | None = None
    summary: tuple[Any, Any] | None = None


def _document_problems(stored: db.MechanismDocument, charge: Charge, checked: _Documents) -> list[str]:
    """A mechanism document hashes to its address, and — for a mechanism that releases one number per label, which
    its description rebuilds exactly (:func:`shared.mechanisms.documents.sampler_from_description`) — the
    rebuilt mechanism's certified ε, computed again from the probabilities the document states, is within the
    charge (the document of any other kind is checked by its address; its ε is its record's ``dp_event``)."""
    found = checked.check(stored)
    damage, certified = found.damage, found.certified
    if damage is not None:
        return [f"mechanism document {stored.hash[:12]}… {damage}"]
    if certified is not None and charge.rdp is None and not within_charge(certified, charge.units):
        return [f"mechanism document {stored.hash[:12]}… re-certifies to ε {certified!r}, more than was charged"]
    return []


def _document_check(stored: db.MechanismDocument, max_bytes: int) -> _Checked:
    try:
        document = documents.unpack(stored.body, max_bytes)
    except documents.Unreadable as error:
        return _Checked(str(error))
    if documents.address(document) != stored.hash:
        return _Checked("does not hash to its address")
    description = document.get("description")
    if not isinstance(description, dict):
        return _Checked("has no description")
    prior = document.get("noisy_prior")
    summary = (documents.summary(description), documents.summary(prior) if prior else None)
    try:
        return _Checked(None, float(sampler_from_description(description).certified_epsilon), summary)
    except LabelDPError:
        return _Checked(None, None, summary)


def _file_problems(ledger: Ledger, release: db.Release) -> list[str]:
    """An available release's labels file is the one recorded when it became available."""
    if release.state != "available":
        return []
    if release.file_size is None or release.file_sha256 is None:
        return [f"release {release.id}: its file's size and hash were never recorded"]
    try:
        found = ledger.store.checked_digest(release.file, release.file_size)  # (not read if of another size)
    except OSError:
        return [f"release {release.id}: its labels file is missing"]
    if found != (release.file_size, release.file_sha256):
        return [f"release {release.id}: its labels file is damaged ({found[0]} bytes, {release.file_size} recorded)"]
    return []


def _label_file_problems(session: Session, ledger: Ledger, dataset: db.Dataset, replayed: Replayed) -> list[str]:
    """Each label version's file is the one its upload chained (bytes and SHA-256), and a source's counts file the
    one its registration chained."""
    problems = []
    for row in session.scalars(select(db.LabelVersion).where(db.LabelVersion.dataset_id == dataset.id)
                               .order_by(db.LabelVersion.version)):
        fact = replayed.labels.get(row.version)
        if fact is None:
            continue
        try:
            found = ledger.store.checked_digest(row.file, fact.file_bytes)
        except OSError:
            problems.append(f"label version {row.version}: its file is missing")
            continue
        if found != (fact.file_bytes, fact.file_sha256):
            problems.append(f"label version {row.version}: its file is not the one uploaded")
    if replayed.source is not None:  # a source dataset's counts, which its releases plan from
        try:
            counts: tuple[int, str] | None = ledger.store.checked_digest(replayed.source.counts_file,
                                                                         replayed.source.counts_bytes)
        except OSError:
            counts = None
        if counts != (replayed.source.counts_bytes, replayed.source.counts_sha256):
            problems.append("the source's counts file is missing or not the one registered")
    return problems + _domain_problems(session, ledger, dataset)


def _domain_problems(session: Session, ledger: Ledger, dataset: db.Dataset) -> list[str]:
    """The current label version's labels lie in the dataset's domain: a domain edited before migration 0022 chained
    it as the row said (the thirty-fifth review shrank [0, 1000] to [0, 1]) would make its releases charge and then
    fail on the labels outside it. (A source's counts are checked against the domain's support before any release.)"""
    version = session.scalar(select(db.LabelVersion).where(db.LabelVersion.dataset_id == dataset.id,
                                                           db.LabelVersion.version == dataset.label_version))
    if version is None or dataset.source_uri is not None:
        return []
    try:
        domain = domain_from_spec(json.loads(dataset.domain_json))
        for batch in labelstore.iter_version(ledger.store, version.file, columns=("label",)):
            labels = batch.column("label").to_numpy()
            domain.check(labels) if isinstance(domain, ContinuousInterval) else domain.index_of(labels)
    except LabelDPError:  # (which labels is not said: a report names no label)
        return [f"label version {version.version} holds labels outside the dataset's domain"]
    except (*_STATE_ERRORS, KeyError, TypeError):  # a file missing or damaged is reported with the files
        return []
    return []


def _open_states(session: Session, sessions: sessionmaker, ledger: Ledger, dataset: db.Dataset,
                 accounts: Sequence[db.BudgetAccount]) -> list[AccountState | None]:
    """Every account's state, opened now (an opened file stays readable when a later charge removes it); None for
    one whose files are missing or damaged although the newest state still names them (SQLite: the snapshot holds
    the write lock, so what it names is the newest)."""
    states: list[AccountState | None] = []
    for account in accounts:
        try:
            states.append(ledger.state(account, dataset.registry_size))
        except _STATE_ERRORS:
            if session.get_bind().dialect.name != "postgresql":
                states.append(None)
                continue
            named = (account.classes_file, account.spent_file, account.rdp_file)
            with sessions() as fresh, fresh.begin():
                now = fresh.get(db.BudgetAccount, account.id)
                if now is None or (now.classes_file, now.spent_file, now.rdp_file) != named:
                    raise _Changed from None
            states.append(None)
    return states
