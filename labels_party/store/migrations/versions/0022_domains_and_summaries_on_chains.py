"""Every dataset's label domain, every available release's shown summary and every queued release's document are on
its chain.

From this version a ``domain`` fact records a dataset's label kind and the SHA-256 of its domain's JSON (what every
release's support, range, clipping and noise scale are computed from, and every upload checked against), and each
``release_available`` fact the digest of what the release's row shows besides its record (its description's and
noisy prior's summaries, its ε split); a row that says otherwise is refused, at a start, at a release, an upload
and a read (``labels_party/ledger/agreement.py``: issue 40's thirty-fourth review rewrote a 2-class dataset's domain
to 3 classes, and a release's shown ε, and verify-audit said valid). This migration appends, once, a ``domain`` fact
to every dataset's chain that has none, a ``release_summary`` fact for every available release whose chain
states no summary, and a ``release_document`` fact for every release not available whose document is stored (a
source release's, for its job: from this version a job runs only the document and splits its chain states), and a
``labels`` fact for every label version uploaded before versions were chained (its file's bytes and SHA-256, its
examples, registry end, coverage hash and ids' bytes: from this version every version read, and the registry an
upload numbers new ids against, is the chain's — the thirty-ninth review hid a version from the registry and the
same ids were registered again with fresh budgets) — as the rows and files now say (the chain has no earlier
record of them: taken on trust at the upgrade; verify-audit still compares every release's summary with its
hash-addressed mechanism document) — and
moves the dataset's anchor to the new head, as 0016-0019 do; the process that runs the upgrade signs and exports
the transitions (:func:`labels_party.runtime.context.upgrade_database`).

Written with the standard library and SQL only (as 0016), so that later changes to the service's modules cannot
change what this migration does.

Revision ID: 0022
Revises: 0021
"""

import hashlib
import json
import os
import stat
import uuid
from datetime import datetime, timezone
from pathlib import Path

import sqlalchemy as sa
from alembic import context, op

from shared.errors import ErrorCode, LabelDPError

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    bind = op.get_bind()
    datasets = bind.execute(sa.text("SELECT id, ledger_seq, ledger_head, label_kind, domain_json FROM datasets "
                                    "ORDER BY id")).all()
    now = datetime.now(timezone.utc)
    for dataset in datasets:
        records = [json.loads(record) for (record,) in bind.execute(sa.text(
            "SELECT record FROM ledger WHERE dataset_id = :d ORDER BY seq"), {"d": dataset.id})]
        facts = [] if any(r.get("event") == "domain" for r in records) else [
            {"event": "domain", "label_kind": dataset.label_kind,
             "domain_sha256": hashlib.sha256(dataset.domain_json.encode()).hexdigest()}]
        facts += _unchained_versions(bind, dataset.id,
                                     {r.get("version") for r in records if r.get("event") == "labels"})
        stated = {r.get("release_id") for r in records if r.get("event") in ("release_summary", "release_document")
                  or (r.get("event") == "release_available" and r.get("summary_sha256") is not None)}
        for release in bind.execute(sa.text(
                "SELECT id, state, mechanism_hash, certified_epsilon, description_json, prior_json, prior_epsilon, "
                "randomizer_epsilon FROM releases WHERE dataset_id = :d AND (state = 'available' OR mechanism_hash "
                "IS NOT NULL) ORDER BY created_at, id"), {"d": dataset.id}):
            if release.id in stated:
                continue
            summary = _summary(release.description_json, release.prior_json, release.prior_epsilon,
                               release.randomizer_epsilon)
            if release.state == "available":
                facts.append({"event": "release_summary", "release_id": release.id, "summary_sha256": summary})
            else:  # a source release's document and splits, for its job (which may run again): what the job runs
                facts.append({"event": "release_document", "release_id": release.id,
                              "mechanism_hash": release.mechanism_hash,
                              "certified_epsilon": None if release.certified_epsilon is None
                              else float(release.certified_epsilon), "summary_sha256": summary,
                              **_splits(bind, release.id)})
        if facts:
            _append(bind, dataset, facts, now)


def _unchained_versions(bind, dataset_id: str, chained: set) -> list[dict]:
    """A ``labels`` fact for each label version uploaded before versions were chained, as its row and file say (a
    version whose file is missing or not a regular file of the data directory is left unchained: the service
    refuses to read it)."""
    facts = []
    for row in bind.execute(sa.text(
            "SELECT version, file, num_examples, registry_end, coverage_sha256, id_bytes FROM label_versions "
            "WHERE dataset_id = :d ORDER BY version"), {"d": dataset_id}):
        digest = None if row.version in chained else _file_digest(row.file)
        if digest is not None:
            facts.append({"event": "labels", "version": int(row.version), "file_bytes": digest[0],
                          "file_sha256": digest[1], "num_examples": int(row.num_examples),
                          "registry_end": int(row.registry_end), "coverage_sha256": row.coverage_sha256,
                          "id_bytes": None if row.id_bytes is None else int(row.id_bytes)})
    return facts


def _file_digest(relative: str) -> tuple[int, str] | None:
    """(bytes, SHA-256) of a label version's file — a directory: its part files in name order — as
    labels_party.store.storage.file_digest is at this revision; None if it is not there."""
    root = Path(_data_dir())
    path = root / relative
    if Path(relative).is_absolute() or ".." in Path(relative).parts:
        return None
    parts = sorted(path.glob("part-*.parquet")) if path.is_dir() and not path.is_symlink() else [path]
    digest, size = hashlib.sha256(), 0
    for part in parts:
        try:
            if not stat.S_ISREG(os.lstat(part).st_mode):
                return None
            with open(part, "rb") as handle:
                while block := handle.read(1 << 20):
                    digest.update(block)
                    size += len(block)
        except FileNotFoundError:
            return None
    return size, digest.hexdigest()


def _summary(description_json: str, prior_json: str | None, prior_epsilon: float, randomizer_epsilon: float) -> str:
    """labels_party.ledger.records.summary_digest as it is at this revision."""
    return hashlib.sha256(_canonical({"description": description_json, "noisy_prior": prior_json,
                                      "prior_epsilon": float(prior_epsilon),
                                      "randomizer_epsilon": float(randomizer_epsilon)}).encode()).hexdigest()


def _splits(bind, release_id: str) -> dict:
    """The input splits the release's job was queued with (Spark's defaults, pinned then, for a job without them)."""
    spec = bind.execute(sa.text("SELECT spec_json FROM jobs WHERE kind = 'privatize_source' AND subject_id = :r"),
                        {"r": release_id}).scalar()
    queued = json.loads(spec) if spec else {}
    return {"max_partition_bytes": int(queued.get("max_partition_bytes", 128 << 20)),
            "min_partitions": int(queued.get("min_partitions", 64))}


def _canonical(record: dict) -> str:
    return json.dumps(record, sort_keys=True, separators=(",", ":"), allow_nan=False)


def _append(bind, dataset, facts: list[dict], now: datetime) -> None:
    """``facts`` appended to the dataset's chain, its head and anchor moved (one transition, as a transaction's)."""
    data_dir = _data_dir()
    seq, head = int(dataset.ledger_seq), str(dataset.ledger_head)
    for fact in facts:
        seq += 1
        record = _canonical({**fact, "seq": seq, "dataset_id": dataset.id, "created_at": now.isoformat()})
        digest = hashlib.sha256((head + record).encode()).hexdigest()
        bind.execute(sa.text("INSERT INTO ledger (dataset_id, seq, release_id, record, prev_hash, hash, created_at) "
                             "VALUES (:d, :seq, NULL, :record, :prev, :hash, :t)"),
                     {"d": dataset.id, "seq": seq, "record": record, "prev": head, "hash": digest, "t": now})
        head = digest
    bind.execute(sa.text("UPDATE datasets SET ledger_seq = :seq, ledger_head = :head WHERE id = :d"),
                 {"seq": seq, "head": head, "d": dataset.id})
    _write(Path(data_dir) / "anchors" / f"{dataset.id}.json", json.dumps({
        "seq": seq, "head": head, "previous_seq": int(dataset.ledger_seq),
        "previous_head": dataset.ledger_head}).encode())


def _data_dir() -> str:
    data_dir = context.config.attributes.get("data_dir")
    if data_dir is None or not Path(data_dir).is_dir():
        raise LabelDPError("this upgrade records datasets' domains, label versions and releases' summaries on the "
                           "audit chains and moves their anchors in the data directory: give it (labeldp labels "
                           "upgrade-db --data-dir DIR); the database was not changed",
                           code=ErrorCode.DATABASE_OUTDATED)
    return str(data_dir)


def downgrade() -> None:
    raise NotImplementedError("the ledger is append-only: facts once chained are not removed")


def _write(target: Path, data: bytes) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
    with open(temporary, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    temporary.replace(target)
