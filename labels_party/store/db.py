"""Storage of metadata, grants, releases and the privacy ledger (SQLAlchemy 2; SQLite by default, PostgreSQL in
production). Large arrays (labels, privatized labels, per-example budget vectors) live in files, see
:mod:`labels_party.store.storage`; the database points at them and is the single source of truth for what exists.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy import false as sa_false
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from shared.service.database import (  # noqa: F401 (make_engine, new_id, utcnow: this module's API)
    NAMING_CONVENTION,
    UtcDateTime,
    make_engine,
    new_id,
    utcnow,
)
from shared.service.keys import ApiKeyColumns, OrganizationColumns
from shared.service.leases import LeaseColumns


class Base(DeclarativeBase):
    # Deterministic constraint names on every database, so that migrations can name what they change.
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Organization(OrganizationColumns, Base):
    pass


class ApiKey(ApiKeyColumns, Base):  # roles: admin | consumer
    # The audit key's signed statement of what this key is (labels_party/ledger/key_certificates.py): a key is
    # honoured only as its certificate says (None: a row the service did not issue)
    certificate: Mapped[str | None] = mapped_column(Text, nullable=True)


class Dataset(Base):
    __tablename__ = "datasets"
    __table_args__ = (UniqueConstraint("owner_org_id", "name"),)
    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    owner_org_id: Mapped[int] = mapped_column(ForeignKey("organizations.id"))
    name: Mapped[str] = mapped_column(String(200))
    label_kind: Mapped[str] = mapped_column(String(20))
    domain_json: Mapped[str] = mapped_column(Text)
    # ε in exact integer units of 10⁻⁹ (labels_party.ledger.UNITS_PER_EPSILON): sums are exact, no tolerance.
    epsilon_total_units: Mapped[int] = mapped_column(BigInteger)
    # Σ over the accounts of their largest per-example spent units: an upper bound on any example's spent ε
    epsilon_spent_units: Mapped[int] = mapped_column(BigInteger, default=0)
    delta_total: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")  # per example
    allow_central_training: Mapped[bool] = mapped_column(Boolean, default=False)
    label_version: Mapped[int] = mapped_column(Integer, default=0)
    num_examples: Mapped[int] = mapped_column(BigInteger, default=0)
    registry_size: Mapped[int] = mapped_column(BigInteger, default=0)  # every example id ever seen
    ledger_seq: Mapped[int] = mapped_column(Integer, default=0)
    ledger_head: Mapped[str] = mapped_column(String(64), default="0" * 64)
    # a Parquet dataset released by Spark jobs in place (no uploads); registry indices are its rows' positions
    source_uri: Mapped[str | None] = mapped_column(String(1000), nullable=True)
    # Its copy taken at registration (labels_party.spark.snapshot), the only files Spark reads for it: location
    # under the data directory, SHA-256 over its files' paths, sizes and contents, and the exact label counts
    # (.npy, support order). None for sources registered before copies were taken: those are not released.
    source_snapshot: Mapped[str | None] = mapped_column(String(300), nullable=True)
    source_sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)
    source_counts_file: Mapped[str | None] = mapped_column(String(300), nullable=True)
    # Σ of its example ids' UTF-8 bytes as the registration counted them: what a release's output holds at least,
    # whatever the copy's compression (labels_party.store.usage estimates releases on it)
    source_id_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # what its registration may store, from its source's size at the request, until the copy is placed and counted
    # itself (issue 40's 33rd review: queued registrations counted nothing, and ten stored 2.58 times the quota)
    source_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # ready, or (a source dataset) registering -> ready | failed: its copy and count are a job
    # (labels_party/runtime/jobs.py); a failed registration's {"code", "message"} (the refusal of its owner's source) in
    # error_json
    state: Mapped[str] = mapped_column(String(20), default="ready", server_default="ready")
    error_json: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)


class BudgetAccount(Base):
    """An organization's allocation of every example's budget in one dataset, and its spent state
    (:mod:`labels_party.ledger`): the owner's account is made with the dataset, a consumer's with its grant.
    Allocations of one dataset sum to at most its budget."""

    __tablename__ = "budget_accounts"
    __table_args__ = (UniqueConstraint("dataset_id", "org_id"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    dataset_id: Mapped[str] = mapped_column(ForeignKey("datasets.id"))
    org_id: Mapped[int] = mapped_column(ForeignKey("organizations.id"))
    epsilon_units: Mapped[int] = mapped_column(BigInteger)  # per example, exact units
    delta: Mapped[float] = mapped_column(Float, default=0.0)  # per example
    # coverage classes (labels_party.ledger.AccountState): class of each example, (units, size) and RDP per class
    generation: Mapped[int] = mapped_column(Integer, default=0)
    classes_file: Mapped[str | None] = mapped_column(String(300), nullable=True)
    spent_file: Mapped[str | None] = mapped_column(String(300), nullable=True)
    rdp_file: Mapped[str | None] = mapped_column(String(300), nullable=True)
    spent_max_units: Mapped[int] = mapped_column(BigInteger, default=0)
    # set by the migration to per-organization accounts: the state is rebuilt from the records at startup
    needs_rebuild: Mapped[bool] = mapped_column(Boolean, default=False, server_default=sa_false())
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)


class LabelVersion(Base):
    __tablename__ = "label_versions"
    __table_args__ = (UniqueConstraint("dataset_id", "version"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    dataset_id: Mapped[str] = mapped_column(ForeignKey("datasets.id"))
    version: Mapped[int] = mapped_column(Integer)
    file: Mapped[str] = mapped_column(String(300))
    num_examples: Mapped[int] = mapped_column(BigInteger)
    # labels the dataset's declared clip moved to its bounds in this upload
    clipped_below: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    clipped_above: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # the example ids this version introduced are its rows with registry_index in [registry_start, registry_end)
    registry_start: Mapped[int] = mapped_column(BigInteger)
    registry_end: Mapped[int] = mapped_column(BigInteger)
    # the version's sorted registry indices, content-addressed (what a release of the whole version covers)
    coverage_file: Mapped[str] = mapped_column(String(300))
    coverage_sha256: Mapped[str] = mapped_column(String(64))
    # Σ of its example ids' UTF-8 bytes (labelstore.ingest): the label-independent base of a release's storage
    # estimate (labels_party.store.usage)
    id_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)


class Grant(Base):
    __tablename__ = "grants"
    __table_args__ = (UniqueConstraint("dataset_id", "org_id"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    dataset_id: Mapped[str] = mapped_column(ForeignKey("datasets.id"))
    org_id: Mapped[int] = mapped_column(ForeignKey("organizations.id"))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)


class MechanismDocument(Base):
    """A mechanism's full public description (probabilities, outputs, noisy prior, model parameters …), stored once
    in its packed binary form (:func:`labels_party.ledger.documents.pack`) and addressed by the SHA-256 of its canonical
    JSON; releases reference it, responses stay small."""

    __tablename__ = "mechanism_documents"
    hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    body: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)


class Release(Base):
    __tablename__ = "releases"
    # Idempotency keys belong to the requesting organization: one organization cannot see, replay or collide with
    # another's.
    __table_args__ = (UniqueConstraint("dataset_id", "requester_org_id", "idempotency_key",
                                       name="uq_releases_dataset_org_key"),)
    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    dataset_id: Mapped[str] = mapped_column(ForeignKey("datasets.id"))
    requester_org_id: Mapped[int] = mapped_column(ForeignKey("organizations.id"))
    idempotency_key: Mapped[str] = mapped_column(String(200))
    body_hash: Mapped[str] = mapped_column(String(64))
    mechanism: Mapped[str] = mapped_column(String(50))
    epsilon: Mapped[float] = mapped_column(Float)  # as requested
    charge_units: Mapped[int] = mapped_column(BigInteger)  # what the ledger charged: ε rounded up to 10⁻⁹
    certified_epsilon: Mapped[float | None] = mapped_column(Float, nullable=True)  # once computed
    prior_epsilon: Mapped[float] = mapped_column(Float)
    randomizer_epsilon: Mapped[float] = mapped_column(Float)
    num_examples: Mapped[int] = mapped_column(BigInteger)
    label_version: Mapped[int] = mapped_column(Integer)
    description_json: Mapped[str] = mapped_column(Text, default="{}")  # the small summary; the full document below
    mechanism_hash: Mapped[str | None] = mapped_column(ForeignKey("mechanism_documents.hash"), nullable=True)
    prior_json: Mapped[str | None] = mapped_column(Text, nullable=True)  # small summary of the noisy prior
    file: Mapped[str] = mapped_column(String(300))
    # the file as it was when the release became available (storage.DataStore.digest): a download or verify-audit
    # that finds it otherwise reports it damaged, never serves it
    file_size: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    file_sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # running -> available | failed. Charged when it is created, before anything private is drawn: a failed
    # release stays charged (releases/transaction.py)
    state: Mapped[str] = mapped_column(String(20), default="available", server_default="available")
    error_json: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)

    def own_file(self) -> str | None:
        """Its labels' file (``releases/{id}`` and a suffix), or None if the row names any other path: a row edited
        outside the service names nothing a job writes or removes (the thirty-sixth and thirty-seventh reviews had
        one delete a directory outside the data directory)."""
        own = self.id.isalnum() and self.file.removeprefix(f"releases/{self.id}") in ("", ".parquet")
        return self.file if own else None  # (an id of letters and digits: "." would name the whole directory)


class LedgerEntry(Base):
    """Append-only. ``record`` is canonical JSON describing the privacy event completely; ``hash`` chains it to
    the previous entry of the same dataset: sha256(prev_hash || record)."""

    __tablename__ = "ledger"
    __table_args__ = (UniqueConstraint("dataset_id", "seq"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    dataset_id: Mapped[str] = mapped_column(ForeignKey("datasets.id"))
    seq: Mapped[int] = mapped_column(Integer)
    release_id: Mapped[str | None] = mapped_column(String(32), nullable=True)
    record: Mapped[str] = mapped_column(Text)
    prev_hash: Mapped[str] = mapped_column(String(64))
    hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)


class Job(LeaseColumns, Base):
    """A durable job (:mod:`labels_party.runtime.jobs`), run by any replica's workers under a lease: ``register_source``
    copies and counts a source dataset (subject: the dataset), ``privatize_source`` runs a source release's Spark job
    (subject: the release). ``spec`` is public JSON; a release's secret is only ever stored sealed
    (:mod:`shared.service.sealing`, context ``release-secret:<release id>``), and dropped once it is available.
    ``result_json`` (no secret, nothing about the labels) is written when the job succeeds: where its Spark work ran."""

    __tablename__ = "jobs"
    __table_args__ = (UniqueConstraint("kind", "subject_id"), Index("ix_jobs_state", "state"))
    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    org_id: Mapped[int] = mapped_column(ForeignKey("organizations.id"))  # whose request made it
    kind: Mapped[str] = mapped_column(String(30))
    subject_id: Mapped[str] = mapped_column(String(32))
    state: Mapped[str] = mapped_column(String(20), default="queued")  # queued | running | succeeded | failed
    spec_json: Mapped[str] = mapped_column(Text)
    sealed_secret: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    error_code: Mapped[str | None] = mapped_column(String(50), nullable=True)
    error_message: Mapped[str | None] = mapped_column(Text, nullable=True)
    result_json: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow, onupdate=utcnow)


class ConsoleSession(Base):
    """A signed-in session of the owner's console (:mod:`labels_party.http.console`): the cookie's random token is
    stored only as its SHA-256; the session acts as the admin key it was opened with (revoking the key ends it)."""

    __tablename__ = "console_sessions"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    api_key_id: Mapped[int] = mapped_column(ForeignKey("api_keys.id"))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UtcDateTime())

