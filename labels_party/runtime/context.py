"""The labels party's context: settings, database sessions, the data store, the ledger, the Spark session, the job
workers and the sealer of their secrets, and the release quotas, built once per process by :func:`make_context`
(which refuses a database behind its data directory and collects what crashed processes left), and passed
explicitly to everything that needs it. The job workers (:mod:`labels_party.runtime.jobs`) are built here and started
only by ``serve``: commands such as ``create-key`` run none, and tests drive them with ``ctx.jobs.run_pending()``."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
from sqlalchemy import inspect, select, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import sessionmaker

from labels_party.ledger import HeadSigner, Ledger, entries, key_certificates, load_key_file, replay
from labels_party.ledger.records import secret_digest
from labels_party.ledger.signing import load_or_create_key_file, public_hex
from labels_party.runtime import jobs, recovery
from labels_party.runtime.quotas import ReleaseQuotas
from labels_party.runtime.settings import LabelsSettings
from labels_party.spark.snapshot import local_path
from labels_party.store import db, housekeeping, migrations
from labels_party.store.storage import DataStore
from shared.errors import ErrorCode, LabelDPError
from shared.randomness import secure_rng
from shared.service.budgets import ByteBudget
from shared.service.keyfiles import create_private_file
from shared.service.leases import JobRunner, Lease
from shared.service.scratch import Scratch
from shared.service.sealing import Sealer, sealer
from shared.service.storage_quota import org_quota
from shared.spark.runner import SparkJobs
from shared.spark.security import spark_secret

log = logging.getLogger("labeldp.labels")


def _no_checkpoint(_name: str) -> None:
    pass


@dataclass(frozen=True)
class ServiceContext:
    sessions: sessionmaker
    store: DataStore
    ledger: Ledger
    settings: LabelsSettings
    # Called with a name at the release transaction's checkpoints ("before_charge_commit", …): the
    # crash-safety tests inject one that kills the process there; in production it does nothing.
    checkpoint: Callable[[str], None] = _no_checkpoint
    # A fresh generator for each release's randomness: the cryptographic source; tests and benchmarks inject a
    # seeded one (shared.randomness.SeededSource) to make runs repeatable.
    random_source: Callable[[], np.random.Generator] = secure_rng
    spark_jobs: SparkJobs = field(kw_only=True)  # this process's Spark session (labels_party.spark)
    scratch: Scratch = field(kw_only=True)  # this process's spool directory under the data directory
    quotas: ReleaseQuotas = field(kw_only=True)  # this process's release slots and time buckets per organization
    sealer: Sealer = field(kw_only=True)  # seals jobs' secrets under the deployment's key (shared.service.sealing)
    jobs: JobRunner = field(kw_only=True)  # this process's job workers (labels_party.runtime.jobs); `serve` starts them
    # What this process's prior and group bodies hold while decoded and released (labels_party.store.uploads.Decoded)
    columnar_memory: ByteBudget = field(kw_only=True)
    storage_quota: int = field(kw_only=True)  # what one organization may store (shared.service.storage_quota)

    def close(self) -> None:
        """Let go of the data directory and the database (a context that is done: tests, commands)."""
        self.jobs.stop()
        self.scratch.close()
        self.sessions.kw["bind"].dispose()


def make_context(database_url: str | None = None, data_dir: str | Path | None = None, *,
                 settings: LabelsSettings | None = None, upgrade: bool = False,
                 checkpoint: Callable[[str], None] = _no_checkpoint,
                 random_source: Callable[[], np.random.Generator] = secure_rng) -> ServiceContext:
    """The service's context from settings (``LABELDP_*`` environment variables by default); an explicit database
    URL or data directory overrides them."""
    overrides = {k: v for k, v in (("database_url", database_url), ("data_dir", data_dir)) if v is not None}
    settings = (settings or LabelsSettings()).model_copy(update=overrides)
    secrets = sealer(settings)  # a malformed or exposed key file is refused at start
    store = DataStore(settings.data_dir)
    signer = audit_signer(settings)
    if upgrade:
        upgrade_database(settings, signer)
    engine = db.make_engine(settings.database_url)
    sessions = migrations.make_sessionmaker(engine, data_dir=settings.data_dir)
    _mark_keys_certified(settings)
    ledger = Ledger(store, signer)
    scratch = Scratch(settings.data_dir, settings.spool_budget_bytes, settings.json_decode_wait_seconds)
    spark_jobs = SparkJobs(settings.spark_master, str(Path(settings.data_dir).resolve() / "tmp" / "spark"),
                           spark_secret(settings.spark_master, settings.spark_secret_file))
    check_source_prefixes(settings)

    def run_job(lease: Lease, lost: threading.Event) -> None:
        from labels_party.runtime import workers  # the releases' code, imported by the first job: a command such as
        # create-key, which runs none, starts without it (issue 42)

        workers.run(ctx, lease, lost)  # the context below: a job runs only once it exists

    ctx = ServiceContext(sessions, store, ledger, settings, checkpoint, random_source, spark_jobs=spark_jobs,
                         scratch=scratch, quotas=ReleaseQuotas(settings), sealer=secrets,
                         jobs=jobs.make_runner(sessions, settings, store, run_job),
                         columnar_memory=columnar_budget(settings),
                         storage_quota=org_quota(settings.max_stored_bytes_per_org, Path(settings.data_dir)))
    try:
        recovery.recover(store, sessions, ledger, scratch)  # refuses a database behind the data directory
        # Collection must run after the check that the database was not rolled back (rows would be missing and
        # their files look unreferenced): keep it last.
        housekeeping.collect(store, sessions, scratch)
    except BaseException:
        ctx.close()  # a refused start holds neither the database nor the data directory
        raise
    return ctx


def columnar_budget(settings: LabelsSettings) -> ByteBudget:
    """The process's memory for prior and group bodies: one organization's requests hold at most three quarters of
    it (or one body's limit, if more), so that its bodies never hold it all: by default one body at the limit and one
    of a quarter of the budget beside it, and a quarter left for other organizations."""
    total, one = settings.columnar_decode_budget_bytes, settings.max_columnar_decoded_bytes
    return ByteBudget(total, one, settings.json_decode_wait_seconds, per_owner=max(one, total * 3 // 4))


def _chain_heads(engine: Engine) -> dict[str, tuple[int, str]]:
    """Every dataset's chain head (none in a database without datasets yet)."""
    try:
        with engine.connect() as connection:
            rows = connection.execute(text("SELECT id, ledger_seq, ledger_head FROM datasets")).all()
    except DBAPIError:
        return {}
    return {row.id: (int(row.ledger_seq), str(row.ledger_head)) for row in rows}


def _sign_migrated(engine: Engine, signer: HeadSigner, before: dict[str, tuple[int, str]]) -> None:
    """The upgrade this process just ran appended facts to some chains (migrations 0010, 0016, 0017, 0018): it signs and
    exports each such transition, as the service does after its own commits — the operator's upgrade wrote them."""
    for dataset_id, (seq, head) in sorted(_chain_heads(engine).items()):
        previous = before.get(dataset_id)
        if previous is not None and previous != (seq, head):
            signer.export(signer.sign(dataset_id, seq, head, previous=previous))


@dataclass(frozen=True)
class Upgraded:
    """What an upgrade did: the schema's revisions before and after, and the keys it found but did not certify."""

    before: str | None
    after: str
    keys_not_certified: tuple[str, ...] = ()


def upgrade_database(settings: LabelsSettings, signer: HeadSigner | None = None) -> Upgraded:
    """Migrate the database (``labeldp labels upgrade-db``, ``serve --upgrade-db``: one path), then vouch for what
    the migrations did as the operator's upgrade: sign and export the chain transitions they appended, and — the
    first time this data directory sees key certificates (migration 0019) — certify the keys found that their
    chains made as they stand."""
    signer = signer or audit_signer(settings)
    engine = db.make_engine(settings.database_url)
    refused: list[str] = []
    try:
        heads = _chain_heads(engine)
        certifying = not _keys_certified(engine) and not _certified_marker(settings).exists()
        before, after = migrations.MIGRATIONS.upgrade(engine, settings.data_dir)
        _sign_migrated(engine, signer, heads)
        if certifying:
            refused = _certify_keys(sessionmaker(engine, expire_on_commit=False), signer)
        _mark_keys_certified(settings)
    finally:
        engine.dispose()
    return Upgraded(before, after, tuple(refused))


def _certified_marker(settings: LabelsSettings) -> Path:
    """Written to the data directory once its database has key certificates: a database writer who drops the
    column and sets the schema back cannot have a later upgrade certify rows of their own (issue 40's review)."""
    return Path(settings.data_dir) / "keys-certified"


def _mark_keys_certified(settings: LabelsSettings) -> None:
    marker = _certified_marker(settings)
    if not marker.exists():
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text("this data directory's keys carry certificates (labels_party/ledger/key_certificates.py)\n")


def _keys_certified(engine: Engine) -> bool:
    """Whether the database's keys carry certificates already (migration 0019 ran before); a new database has
    no keys to certify."""
    found = inspect(engine)
    return not found.has_table("api_keys") or "certificate" in {c["name"] for c in found.get_columns("api_keys")}


def _certify_keys(sessions: sessionmaker, signer: HeadSigner) -> list[str]:
    """The upgrade this process just ran added key certificates (migration 0019): it certifies each key that
    exists now whose every chain made it as its row stands — organization, role, prefix, secret, and revoked if a
    chain revoked it — once per data directory (:func:`_certified_marker`). A key no chain knows (a row inserted
    before the upgrade cannot be told from a key of an organization without an account yet) or that a chain
    contradicts (a row edited) is not certified: it is refused until an admin makes a new one. Returns why, per
    key left out (issue 40's fifth review: the upgrade certified an inserted admin row and a consumer row edited
    into another organization's admin)."""
    left_out = []
    with sessions() as session, session.begin():
        chained: dict[int, list[tuple[tuple[str, str, str], str | None, tuple[str, str | None] | None]]] = {}
        for dataset_id in session.scalars(select(db.Dataset.id).order_by(db.Dataset.id)):
            replayed = replay(entries(session, dataset_id))
            for key_id, made in replayed.keys.items():
                chained.setdefault(key_id, []).append((made, replayed.secrets.get(key_id),
                                                       replayed.revoked.get(key_id)))
        for key, org in session.execute(select(db.ApiKey, db.Organization.name)
                                        .join(db.Organization, db.Organization.id == db.ApiKey.org_id)
                                        .where(db.ApiKey.certificate.is_(None)).order_by(db.ApiKey.id)).all():
            facts = chained.get(key.id, [])
            if not facts:
                why = "no chain made it"
            elif any(made != (org, key.role, key.prefix) or (digest is not None and digest != secret_digest(
                    key.key_hash)) or _revocation_lifted(key, revoked) for made, digest, revoked in facts):
                why = "its row differs from what a chain recorded of it"
            else:
                key.certificate = key_certificates.issue(signer.key, key, org)
                continue
            log.warning("key %s (prefix %s) of %s is not certified: %s; it is refused — make a new one with "
                        "labeldp labels create-key", key.id, key.prefix, org, why)
            left_out.append(f"key {key.id} (prefix {key.prefix}) of {org}: {why}")
    return left_out


def _revocation_lifted(key: db.ApiKey, revoked: tuple[str, str | None] | None) -> bool:
    """Whether a chain revoked ``key`` from a time its row no longer says: not revoked at all, or from later (issue
    40's sixth review: a far-future revoked_at makes a revoked key look like one in its rotation's grace)."""
    if revoked is None:
        return False
    if key.revoked_at is None:
        return True
    row = key.revoked_at.replace(tzinfo=timezone.utc) if key.revoked_at.tzinfo is None else key.revoked_at
    since = revoked[1]
    return row > (datetime.fromisoformat(since) if since is not None else datetime.now(timezone.utc))


def audit_signer(settings: LabelsSettings) -> HeadSigner:
    """The audit key and export directory from settings (a key that others may read is refused at start). A
    configured key file must exist; without one, the key under the data directory is used — made by the first
    process that starts, its public key logged once (every deployment signs: nothing it appends is unsigned)."""
    recorded = _recorded_signer(settings)
    if settings.audit_key_file is not None:
        key = load_key_file(settings.audit_key_file)
    elif not settings.audit_key_path.exists() and (recorded is not None or _signed_before(settings)):
        # a key made now would sign accounts another key signed (a deployment from before the record, whose key
        # lives elsewhere, run without LABELDP_AUDIT_KEY_FILE): refused, nothing made
        raise _signer_mismatch(settings, recorded, None)
    else:
        key, made = load_or_create_key_file(settings.audit_key_path)
        if made:
            log.warning("made the audit key %s (set LABELDP_AUDIT_KEY_FILE to keep it elsewhere); its public key, "
                        "which verify-audit --public-key takes: %s", settings.audit_key_path,
                        public_hex(key.public_key()))
    public = public_hex(key.public_key())
    if recorded is None:
        recorded = _record_signer(settings, public)
    if recorded != public:
        raise _signer_mismatch(settings, recorded, public)
    return HeadSigner(key, settings.audit_log_path)


def _signer_record(settings: LabelsSettings) -> Path:
    """The public key that signs this data directory's accounts, written by the first process that signs: another
    key is refused from then on (issue 40's sixth review: ``create-key`` run without the deployment's
    LABELDP_AUDIT_KEY_FILE made a second key under the data directory and signed key facts and certificates with
    it — a false alarm in verify-audit for good, and a key that answered 401)."""
    return Path(settings.data_dir) / "audit-signer"


def _recorded_signer(settings: LabelsSettings) -> str | None:
    """The recorded public key; None if there is no record. A record is written whole (:func:`_record_signer`), so
    one that is not a public key is damage, refused rather than read as none."""
    try:
        recorded = _signer_record(settings).read_text().strip()
    except FileNotFoundError:
        return None
    if len(recorded) != 64 or any(c not in "0123456789abcdef" for c in recorded):
        raise LabelDPError(f"{_signer_record(settings)} does not hold an audit public key: restore it from a "
                           "backup of the data directory", code=ErrorCode.AUDIT_KEY_MISMATCH)
    return recorded


def _record_signer(settings: LabelsSettings, public: str) -> str:
    """Record ``public`` as the data directory's signer — whole (a private temporary file, then linked into place)
    and never over a record — and return the record as it stands: this one, or one a process starting beside this
    one made first."""
    record = _signer_record(settings)
    temporary = record.with_name(f".{record.name}.{os.getpid()}.{os.urandom(8).hex()}.tmp")
    create_private_file(temporary, public.encode() + b"\n", exists="a temporary signer record exists")
    try:
        os.link(temporary, record)
    except FileExistsError:
        pass
    finally:
        temporary.unlink()
    recorded = _recorded_signer(settings)
    assert recorded is not None  # linked just now, or before by another process
    return recorded


def _signed_before(settings: LabelsSettings) -> bool:
    """Whether some audit key signed this data directory's accounts before the signer was recorded: its keys carry
    certificates. (Anchors alone do not say so: a deployment from before every deployment signed has them, and its
    first start makes its key.)"""
    return _certified_marker(settings).exists()


def _signer_mismatch(settings: LabelsSettings, recorded: str | None, public: str | None) -> LabelDPError:
    found = f"the key in use is {public[:16]}…" if public is not None else \
        "no LABELDP_AUDIT_KEY_FILE is set and none is under the data directory"
    signer = f"the audit key {recorded[:16]}…" if recorded is not None else "an audit key that is not here"
    return LabelDPError(f"this data directory's accounts are signed by {signer} and {found}: set "
                        "LABELDP_AUDIT_KEY_FILE to that key's file (nothing was changed)",
                        code=ErrorCode.AUDIT_KEY_MISMATCH)


def check_source_prefixes(settings: LabelsSettings) -> None:
    """Refuse at start an organization's source prefix that holds the service's own files or lies among them (its
    data directory: every organization's labels; the audit export): a review registered another organization's
    uploaded labels file as its own source through a prefix above the data directory."""
    protected = [Path(p).resolve() for p in (settings.data_dir, settings.audit_log_dir) if p is not None]
    for organization, prefixes in settings.spark_sources.items():
        for prefix in prefixes:
            path = local_path(prefix)
            if path is None:
                continue  # not a local prefix: registering from it is refused anyway
            allowed = Path(path).resolve()
            for own in protected:
                if allowed == own or own.is_relative_to(allowed) or allowed.is_relative_to(own):
                    raise LabelDPError(f"the source prefix {prefix!r} of {organization!r} overlaps the service's own "
                                       f"files ({own}): choose a prefix outside the data and audit directories",
                                       code=ErrorCode.USAGE)


def check_epsilon_range(ctx: ServiceContext, epsilon: float, name: str = "epsilon") -> float:
    """The deployment's ε range (settings.epsilon_min/max): outside it a request is refused with a 400."""
    low, high = ctx.settings.epsilon_min, ctx.settings.epsilon_max
    if not low <= epsilon <= high:
        raise LabelDPError(f"{name} must lie in [{low:g}, {high:g}] on this service, got {epsilon!r}",
                           code=ErrorCode.EPSILON_OUT_OF_RANGE)
    return epsilon
