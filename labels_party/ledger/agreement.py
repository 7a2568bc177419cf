"""The tables against the chain: what the service honours is what its chain says, never a table alone.

A dataset's chain is hash-linked, and its head is anchored in the data directory at every append (before the
commit) and signed after it; a database writer can edit a table, but cannot append to the chain or rewrite it
without the anchor (:meth:`~labels_party.ledger.Ledger.check_anchor`) or the signed heads giving it away. So every
budget-relevant table is derived state, checked against the chain's replay (:func:`~.chain.replay`) wherever it
matters:

* **at every start** (:func:`check_tables`, from :mod:`labels_party.runtime.recovery`): every dataset's chain is
  read, its links checked up to the anchored head, and the tables compared with it — totals, grants, allocations,
  revoked keys, and every release row (one per charge and no other, its charge, the organization charged, and for
  releases charged since availability is chained, its state, file and mechanism document as its
  :class:`ReleaseFact` says).
  One disagreement and the service does not start: one line (``ledger_tampered``) naming the first finding and how
  many more; ``verify-audit`` lists them all. Nothing is ever "rebuilt" from a table and signed.
* **at every charge** (:func:`charge_problems`, from :meth:`Ledger.charge`, before anything private is drawn): the
  account's allocation and the dataset's totals are the chain's; and **whenever a key acts on a dataset** (a
  charge, an administrator's grant, a download: :func:`key_problems`) the key is on the chain (made, or recorded
  when its organization's account opened) for the organization and role it authenticated as, its row holds the
  secret the chain names, and the chain has not revoked it — a key row or a table edited while the service runs
  is refused (503 ``ledger_tampered``), never honoured.
* **at every read of a release** (:mod:`labels_party.releases.queries`): a release is shown only as its record and
  facts say (:func:`shown_problems`: its charge, organization, ε, counts and summary), and one charged since
  availability is chained is downloaded only as its fact says (file size and SHA-256).
* **wherever the labels are read** (a release, an upload, a registration): the dataset's label kind and domain, owner,
  central-training switch and source are the ones its creation chained (:func:`creation_problems`).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from labels_party.ledger.chain import Replayed
from labels_party.ledger.records import SourceFact, domain_digest, secret_digest, summary_digest
from labels_party.store import db
from shared.errors import ErrorCode, LabelDPError


class LedgerTampered(LabelDPError):
    """A table disagrees with the dataset's chain: the database was changed outside the service."""

    code = ErrorCode.LEDGER_TAMPERED


def tampered(dataset_id: str, problems: list[str]) -> LedgerTampered:
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return LedgerTampered(f"dataset {dataset_id}: {problems[0]}{more} — the database was changed outside the service; "
                          "nothing is charged or served until it agrees with the chain again (labeldp labels "
                          "verify-audit lists every finding; restore the database from a backup)")


def charge_problems(replayed: Replayed, dataset: db.Dataset, org: str, account: db.BudgetAccount) -> list[str]:
    """Why a charge to ``org``'s ``account`` must not go ahead (empty: it may): the totals and the allocation it
    would be admitted by are not what the chain says."""
    problems = []
    if replayed.totals != (dataset.epsilon_total_units, dataset.delta_total):
        problems.append("the dataset's totals differ from the chain's")
    if replayed.allocations.get(org) != (account.epsilon_units, account.delta):
        problems.append(f"{org}'s allocation differs from the chain's")
    return problems


def state_problems(replayed: Replayed, dataset: db.Dataset, org: str, account: db.BudgetAccount,
                   spent: str | None) -> list[str]:
    """Why ``org``'s spent state must not be read (empty: it may): it is not the one its last charge left
    (``spent``: the digest of the state the account's row points at, None if it cannot be read), or the registry
    its classes span is not the chain's."""
    problems = registry_problems(replayed, dataset)  # every index a charge's classes cover
    recorded = replayed.spent_states.get(org)
    if recorded is not None and (account.classes_file, account.rdp_file, spent) != (
            recorded.get("classes_file"), recorded.get("rdp_file"), recorded.get("digest")):
        problems.append(f"{org}'s spent state is not the one its last charge left")
    return problems


def key_problems(replayed: Replayed, key_id: int, key: db.ApiKey | None, org: str, role: str,
                 now: datetime) -> list[str]:
    """Why key ``key_id`` (its row ``key``, as the request authenticated it: for ``org`` as ``role``) must not act
    on the dataset (empty: it may): the chain made it for that organization and role with that prefix, its row
    holds the secret the chain names, and the chain has not revoked it — so no key row edited outside the service
    (its organization, role, secret or revocation) is honoured."""
    made = replayed.keys.get(key_id)
    if made is None:
        return [f"key {key_id} is not on the chain"]
    problems = []
    if key is None or made != (org, role, key.prefix):
        problems.append(f"key {key_id}'s organization, role or prefix differ from the chain's")
    digest = replayed.secrets.get(key_id)
    if key is not None and digest is not None and digest != secret_digest(key.key_hash):
        problems.append(f"key {key_id}'s secret differs from the chain's")
    if key_id in replayed.revoked:
        _prefix, revoked_at = replayed.revoked[key_id]
        if revoked_at is None or datetime.fromisoformat(revoked_at) <= now:
            problems.append(f"key {key_id} is revoked on the chain")
    return problems


def creation_problems(session: Session, dataset: db.Dataset, replayed: Replayed) -> list[str]:
    """Whether the dataset's row holds the label kind and domain, and names the owner, the central-training switch
    and the source its chain made it with (every chain states a domain since migration 0022; chains from before
    owners were chained name none: nothing to compare)."""
    problems = []
    if replayed.domain is None:
        problems.append("the chain records no label domain for the dataset")
    elif (dataset.label_kind, domain_digest(dataset.domain_json)) != (replayed.domain.label_kind,
                                                                      replayed.domain.domain_sha256):
        problems.append("the dataset's label kind or domain differs from the chain's")
    if replayed.owner is None:
        return problems
    org = session.get(db.Organization, dataset.owner_org_id)
    if org is None or org.name != replayed.owner.org:
        problems.append("the dataset's owner differs from the chain's")
    if bool(dataset.allow_central_training) != replayed.owner.central_training:
        problems.append("the dataset's central-training switch differs from the chain's")
    if dataset.source_uri != replayed.owner.source:
        problems.append("the dataset's source differs from the chain's")
    return problems


def table_problems(session: Session, dataset: db.Dataset, replayed: Replayed,
                   names: Mapping[int, str]) -> list[str]:
    """Where the tables disagree with what the chain's facts say now stands (empty: nowhere)."""
    problems = creation_problems(session, dataset, replayed)
    if replayed.labels and max(replayed.labels) != dataset.label_version:
        problems.append(f"the dataset's label version {dataset.label_version} is not the chain's latest "
                        f"({max(replayed.labels)})")
    if replayed.totals is None:
        problems.append("the chain records no budget for the dataset")
    elif replayed.totals != (dataset.epsilon_total_units, dataset.delta_total):
        problems.append("the dataset's totals differ from the chain's")
    grants = {names.get(g.org_id, "?") for g in session.scalars(select(db.Grant).where(
        db.Grant.dataset_id == dataset.id))}
    if grants != replayed.grants:
        problems.append("the grants differ from the chain's")
    rows = session.scalars(select(db.BudgetAccount).where(db.BudgetAccount.dataset_id == dataset.id)).all()
    accounts = {names.get(a.org_id, "?"): (a.epsilon_units, a.delta) for a in rows}
    for org in sorted(accounts.keys() | replayed.allocations.keys()):
        if accounts.get(org) != replayed.allocations.get(org):
            problems.append(f"{org}'s allocation differs from the chain's")
    problems += account_problems(rows, replayed, names)
    problems += registry_problems(replayed, dataset)
    problems += _key_problems(session, replayed)
    problems += _release_problems(session, dataset, replayed, names)
    problems += _label_problems(session, dataset, replayed)
    if replayed.source is not None or (dataset.source_uri is not None and dataset.source_snapshot is not None):
        problems += source_problems(replayed.source, dataset)  # (one registered before snapshots is never read)
    return problems


def account_problems(accounts, replayed: Replayed, names: Mapping[int, str]) -> list[str]:
    """Where the accounts' own bookkeeping disagrees with the chain: a rebuild flag the chain holds no pending
    migration for (a rebuild would sign what the tables say), a spent table not the one the account's generation
    names (its next write would take an older generation's name)."""
    problems = []
    for account in accounts:
        org = names.get(account.org_id, "?")
        if account.needs_rebuild and not replayed.rebuild_pending:
            problems.append(f"{org}'s account is marked for a rebuild, but its chain records budgets set since the "
                            "migration to accounts")
        if account.spent_file is not None and not account.spent_file.endswith(
                f"/spent_{account.generation:08d}.npy"):
            problems.append(f"{org}'s account generation {account.generation} does not name its spent table")
    return problems


def registry_problems(replayed: Replayed, dataset: db.Dataset) -> list[str]:
    """The registry is where the chain's last label version left it, or its source's registration."""
    registry_end = max((fact.registry_end for fact in replayed.labels.values()), default=None)
    if replayed.source is not None:
        registry_end = replayed.source.num_examples
    if registry_end is not None and dataset.registry_size != registry_end:
        return ["the dataset's registry size differs from the chain's"]
    return []


def source_problems(fact: SourceFact | None, dataset: db.Dataset) -> list[str]:
    """Why a release must not read source dataset ``dataset`` as its row says (empty: it may): the chain records
    no registration, or another snapshot, fingerprint, counts file or number of rows."""
    if fact is None:
        return ["the source's registration is not in the chain"]
    if (dataset.source_snapshot, dataset.source_sha256, dataset.source_counts_file, dataset.num_examples,
            dataset.registry_size) != (fact.snapshot, fact.source_sha256, fact.counts_file, fact.num_examples,
                                       fact.num_examples):
        return ["the source's snapshot, counts or rows differ from its registration's on the chain"]
    if fact.id_bytes is not None and dataset.source_id_bytes != fact.id_bytes:  # what its releases are estimated on
        return ["the source's ids' bytes differ from its registration's on the chain"]
    return []


def _label_problems(session: Session, dataset: db.Dataset, replayed: Replayed) -> list[str]:
    """Each label version is the one the chain records (its file's hash: verify-audit reads the file; where its ids
    start: where the previous version's registry ended). Every version is chained (since migration 0022)."""
    problems = []
    rows = session.scalars(select(db.LabelVersion).where(db.LabelVersion.dataset_id == dataset.id)).all()
    for row in rows:
        fact = replayed.labels.get(row.version)
        previous = replayed.labels.get(row.version - 1)
        if fact is None:
            problems.append(f"label version {row.version} is not in the chain")
        elif (row.num_examples, row.registry_end, row.coverage_sha256) != (fact.num_examples, fact.registry_end,
                                                                           fact.coverage_sha256) or \
                fact.id_bytes not in (None, row.id_bytes):  # (its ids' bytes: what its releases are estimated on)
            problems.append(f"label version {row.version} differs from the chain's")
        elif row.registry_start != (previous.registry_end if previous is not None else 0):
            # the ids a version introduced start where the previous version's registry ended (the twenty-first
            # review: an edited start made the next upload of the same ids count them as new)
            problems.append(f"label version {row.version}'s new ids do not start where the chain's registry ended")
    if dataset.label_version and dataset.label_version not in replayed.labels:
        problems.append(f"the dataset's current label version {dataset.label_version} is not in the chain")
    current = replayed.labels.get(dataset.label_version)
    if current is not None and dataset.source_snapshot is None and dataset.num_examples != current.num_examples:
        # what releases count and the API shows (the twenty-third review: an edit passed verify-audit)
        problems.append("the dataset's number of examples differs from its label version's on the chain")
    return problems


def _key_problems(session: Session, replayed: Replayed) -> list[str]:
    problems = []
    if replayed.revoked:
        keys = {k.id: k for k in session.scalars(select(db.ApiKey).where(db.ApiKey.id.in_(replayed.revoked)))}
        for key_id, (prefix, revoked_at) in sorted(replayed.revoked.items()):
            key = keys.get(key_id)
            if key is None or key.prefix != prefix or key.revoked_at is None:
                problems.append(f"key {prefix} is revoked in the chain but not in the keys table")
            elif revoked_at is not None and key.revoked_at.isoformat() != revoked_at:
                problems.append(f"key {prefix} is revoked from {key.revoked_at.isoformat()} in the keys table but "
                                f"from {revoked_at} in the chain")
    return problems


def _release_problems(session: Session, dataset: db.Dataset, replayed: Replayed,
                      names: Mapping[int, str]) -> list[str]:
    releases = {r.id: r for r in session.scalars(select(db.Release).where(db.Release.dataset_id == dataset.id))}
    problems = [f"release {missing} is charged in the chain but missing"
                for missing in sorted(replayed.releases.keys() - releases.keys())]
    # a row still running whose chain made it available (which shown_problems leaves to this check of locked rows: a
    # live reader may read the row before the commit that made it available, and the chain after)
    problems += [f"release {name} is running but the chain says it is available"
                 for name, release in sorted(releases.items()) if release.state == "running"
                 and name in replayed.files_on_chain and name in replayed.available]
    return problems + shown_problems(replayed, [releases[name] for name in sorted(releases)], names)


def shown_problems(replayed: Replayed, releases, names: Mapping[int, str]) -> list[str]:
    """Where ``releases`` (rows of the replayed dataset) disagree with their records and facts: each is charged on
    the chain, for the organization its row names (``names``: organization id -> name), and shows the mechanism, ε,
    example count, label version and summary the chain says; an available one's file and mechanism document are
    its fact's, and one the chain made available is not shown failed. The rows are read before the chain (a
    reader's statements may each see a later commit): so the chain holds whatever they show."""
    problems = []
    for release in releases:
        name = release.id
        if name not in replayed.releases:
            problems.append(f"release {name} is not in the chain")
            continue
        if release.charge_units != replayed.releases[name]:
            problems.append(f"release {name}'s charge differs from its record's")
        charged = replayed.charged_orgs.get(name)
        if charged is not None and names.get(release.requester_org_id) != charged:
            problems.append(f"release {name}'s requester differs from the organization its record charged")
        shown = zip((release.mechanism, release.epsilon, release.num_examples, release.label_version,
                     release.prior_epsilon, release.randomizer_epsilon), replayed.shown.get(name, ()), strict=False)
        if any(recorded is not None and row != recorded for row, recorded in shown):  # what the release row displays
            problems.append(f"release {name}'s mechanism, ε, ε split, example count or label version differs from "
                            "its record's")
        summary = summary_digest(release.description_json, release.prior_json, release.prior_epsilon,
                                 release.randomizer_epsilon)
        if release.state == "available" and replayed.summaries.get(name) != summary:
            problems.append(f"release {name}'s shown summary differs from the chain's")
        problems += document_problems(replayed, release, summary)
        if name not in replayed.files_on_chain:
            continue  # charged before availability was chained: verify-audit checks its file against its row
        fact = replayed.available.get(name)
        if release.state == "running":
            continue  # (see _release_problems)
        if (release.state == "available") != (fact is not None):
            problems.append(f"release {name} is {release.state} but the chain says "
                            f"{'it is available' if fact is not None else 'it never became available'}")
        elif fact is not None and (release.file_size, release.file_sha256, release.mechanism_hash,
                                   release.certified_epsilon) != (fact.file_bytes, fact.file_sha256,
                                                                  fact.mechanism_hash, fact.certified_epsilon):
            problems.append(f"release {name}'s file or mechanism document differs from the chain's")
    return problems


def document_problems(replayed: Replayed, release: db.Release, summary: str) -> list[str]:
    """A release whose document the chain stated before it was computed (a source release's job) shows that
    document, its certified ε and summary — or nothing yet, while running (a row read before the commit that stored
    the document, the chain after); a running release the chain states no document for shows nothing."""
    stated = replayed.documents.get(release.id)
    blank = (release.mechanism_hash, release.certified_epsilon, release.description_json, release.prior_json) == (
        None, None, "{}", None)
    if stated is None:
        return [] if release.state != "running" or blank else [
            f"release {release.id} is running and shows a mechanism document the chain does not state"]
    if release.state == "running" and blank:
        return []
    if (release.mechanism_hash, release.certified_epsilon, summary) != (stated.mechanism_hash,
                                                                        stated.certified_epsilon,
                                                                        stated.summary_sha256):
        return [f"release {release.id}'s mechanism document, certified ε or summary differs from the one the chain "
                "stated before it was computed"]
    return []


def check_tables(session: Session, ledger, datasets) -> None:
    """Every dataset of ``datasets`` (rows, read locked by the caller) against its chain, the chain's links up to
    the head its anchor admitted: :class:`LedgerTampered` at the first dataset that disagrees."""
    names = {o.id: o.name for o in session.scalars(select(db.Organization))}
    for dataset in datasets:
        replayed = ledger.facts(session, dataset)
        problems = replayed.problems + table_problems(session, dataset, replayed, names)
        if problems:
            raise tampered(dataset.id, problems)
