"""The trainer's database: organizations and their API keys, features tables, id lists and jobs (SQLAlchemy 2;
SQLite by default, PostgreSQL in production). Files (features, id lists, models, predictions) live under the data
directory; rows point at them. Every features table, id list and job belongs to one organization."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Float, ForeignKey, Integer, LargeBinary, MetaData, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from shared.service.database import NAMING_CONVENTION, UtcDateTime, new_id, utcnow  # noqa: F401 (new_id: API)
from shared.service.keys import ApiKeyColumns, OrganizationColumns
from shared.service.leases import LeaseColumns


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Organization(OrganizationColumns, Base):
    pass


class ApiKey(ApiKeyColumns, Base):  # roles: admin | member
    pass


class FeatureTable(Base):
    __tablename__ = "feature_tables"
    __table_args__ = (UniqueConstraint("org_id", "name"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    org_id: Mapped[int] = mapped_column(ForeignKey("organizations.id"))
    name: Mapped[str] = mapped_column(String(100))
    file: Mapped[str] = mapped_column(String(300))
    num_examples: Mapped[int] = mapped_column(Integer)
    columns_json: Mapped[str] = mapped_column(Text)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)


class IdList(Base):
    """A named list of example ids of one organization (a job's ``split.holdout_ids``): its ids in ``file``, a file
    of this upload's own, and their content hash (``features_party.id_lists.ids_sha256``), which a job pins."""

    __tablename__ = "id_lists"
    __table_args__ = (UniqueConstraint("org_id", "name"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    org_id: Mapped[int] = mapped_column(ForeignKey("organizations.id"))
    name: Mapped[str] = mapped_column(String(100))
    file: Mapped[str] = mapped_column(String(300))
    num_ids: Mapped[int] = mapped_column(Integer)
    sha256: Mapped[str] = mapped_column(String(64))
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)


class Job(LeaseColumns, Base):
    """A training job, and the trainer's queue: workers of any replica claim rows under leases
    (:mod:`shared.service.leases`, :mod:`features_party.jobs`). Its request is stored without the labels-party API
    key, which is kept sealed (``sealed_api_key``, :mod:`shared.service.sealing`) only until the job ends; its
    progress and result are updated as it goes. ``idempotency_key`` (the client's, unique per organization) and
    ``request_sha256`` (of the request without the API key) make a resent ``POST /v1/jobs`` the same job;
    ``started_at`` (its last claim) orders claims fairly across organizations."""

    __tablename__ = "jobs"
    __table_args__ = (UniqueConstraint("org_id", "idempotency_key"),)
    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    org_id: Mapped[int] = mapped_column(ForeignKey("organizations.id"))
    status: Mapped[str] = mapped_column(String(20))  # queued | running | succeeded | failed | interrupted
    labels_party: Mapped[str] = mapped_column(String(40))
    dataset_id: Mapped[str] = mapped_column(String(64))
    request_json: Mapped[str] = mapped_column(Text)
    release_json: Mapped[str | None] = mapped_column(Text, nullable=True)
    # a finished job's estimate, warnings and (auto) choice: features_party.jobs.JobReport
    report_json: Mapped[str | None] = mapped_column(Text, nullable=True)
    epoch: Mapped[int] = mapped_column(Integer, default=0)
    epochs: Mapped[int] = mapped_column(Integer, default=0)
    metrics_json: Mapped[str] = mapped_column(Text, default="[]")
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    error_code: Mapped[str | None] = mapped_column(String(40), nullable=True)  # an ErrorCode of a failed job
    model_file: Mapped[str | None] = mapped_column(String(300), nullable=True)
    predictions_file: Mapped[str | None] = mapped_column(String(300), nullable=True)
    num_train_examples: Mapped[int] = mapped_column(Integer, default=0)
    num_holdout_examples: Mapped[int] = mapped_column(Integer, default=0)  # features rows its split held out
    seconds: Mapped[float] = mapped_column(Float, default=0.0)
    device: Mapped[str] = mapped_column(String(200), default="")
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
    idempotency_key: Mapped[str | None] = mapped_column(String(200), nullable=True)
    request_sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)
    sealed_api_key: Mapped[bytes | None] = mapped_column(LargeBinary(), nullable=True)
    started_at: Mapped[datetime | None] = mapped_column(UtcDateTime(), nullable=True)
    # what its plan estimated it will store (model, predictions): counted for its organization's quota until it
    # ends (features_party.context.TrainerContext.reserve_output), whatever it has written so far
    output_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")

