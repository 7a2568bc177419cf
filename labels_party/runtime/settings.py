"""Deployment settings of the labels-party service, read from ``LABELDP_*`` environment variables (or passed in).

The ε range is the deployment's policy inside what the mechanisms can certify ([1e-6, 50], shared/privacy.py):
by default [10⁻³, 50]. 10⁻³ because below it a release is so noisy that no model learns from it while every
release still costs a ledger row, a coverage file and a request; a single release that tiny is harmless, but a
floor keeps the ledger from being flooded with them (with exact sums they are no longer free). 50 because beyond
it e^ε ≈ 5·10²¹ makes any label recoverable: a request for more is a request for the labels, not for privacy.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from labels_party.runtime.quotas import QuotaSettings
from shared.privacy import EPSILON_MAX, EPSILON_MIN
from shared.service.limits import HttpSettings
from shared.service.sealing import SecretKeySettings

RENAMED = {"LABELDP_RELEASE_CPU_SECONDS": "LABELDP_RELEASE_SECONDS",
           "LABELDP_RELEASE_CPU_WINDOW_SECONDS": "LABELDP_RELEASE_WINDOW_SECONDS"}


# The HTTP limits of `serve` (shared.service.limits), the per-organization release quotas (labels_party.runtime.quotas)
# and the key that seals jobs' secrets (shared.service.sealing: LABELDP_SECRET_KEY or LABELDP_SECRET_KEY_FILE; unset,
# a key for this process only) are fields of this class too, defined and documented with what uses them.
class LabelsSettings(HttpSettings, QuotaSettings, SecretKeySettings):
    model_config = SettingsConfigDict(env_prefix="LABELDP_", frozen=True, extra="ignore")

    @model_validator(mode="after")
    def _no_renamed_variables(self) -> LabelsSettings:
        """A variable that was renamed would be ignored silently (a tightened quota back at its default)."""
        for old, new in RENAMED.items():
            if old in os.environ:
                raise ValueError(f"{old} is now {new} (the quota debits a release's wall-clock time in its slot)")
        return self

    database_url: str = "sqlite:///var/labels.db"
    data_dir: Path = Path("var/data")
    epsilon_min: float = Field(default=1e-3, gt=0)
    epsilon_max: float = Field(default=50.0, gt=0)
    # The deployment's ceiling on any dataset's per-example δ (mechanisms with δ > 0: central training). 10⁻⁶: δ is
    # the probability that an example's label is not protected; it must stay far below 1/n for the n examples of a
    # dataset (10⁻⁶ ≪ 1/10⁴…1/10⁵ for the tables this service is built for), and no δ-mechanism here needs more.
    delta_max: float = Field(default=1e-6, ge=0, lt=1e-2)
    # A solve that would run longer stops (solver_timeout): on a public prior (the randomizer command) that is the
    # answer; in a release, whose solve runs on a private prior after the charge, the family's fallback is released
    # instead (labels_party/core/registry.py), charged as any release
    solver_seconds: float = Field(default=60.0, gt=0)
    max_upload_bytes: int = Field(default=4 << 30, gt=0)  # label uploads
    max_columnar_bytes: int = Field(default=1 << 30, gt=0)  # per-example prior and group release bodies
    # ... and what such a body decodes to in memory (its rows' ids, priors and groups, from a Parquet body's metadata
    # before it is read, then as it is read: labels_party/store/uploads.py): beyond it, 413 body_too_large (issue 40: a
    # 247 KB Parquet body of 10⁷ dictionary-encoded rows took the server to 3.9 GB). Counted as measured (ids and
    # their copies on the way to the lookup: uploads.ID_ROW_BYTES), 512 MiB is 2.3·10⁶ group assignments of 10-byte
    # ids, or 7.9·10⁵ examples' priors on 10 classes.
    max_columnar_decoded_bytes: int = Field(default=512 << 20, gt=0)
    # ... and what all such bodies being decoded or released at once may hold: each takes its share as it is counted
    # and keeps it until its release is done; a body whose share is not free within json_decode_wait_seconds is 503
    # server_busy with Retry-After, nothing charged (issue 40: four honest group bodies at the limit at once took the
    # server +2,428 MB). 1 GiB: two bodies at the limit, or many small ones.
    columnar_decode_budget_bytes: int = Field(default=1 << 30, gt=0)
    max_json_bytes: int = Field(default=64 << 20, gt=0)  # release, evaluation and training requests
    # Per-request limits on what one release may create, both decided from public inputs before anything private is
    # computed or charged (labels_party/releases/kinds.py): 400 too_many_groups beyond the groups of a group release
    # (each gets its own prior, solve and randomizer: a thousand one-example groups on 256 classes grow the server
    # by ~10 MB and make a ~1 MB document, bench/group_documents.py); 400 document_too_large beyond the mechanism
    # document bytes a request is predicted to create (8 bytes per number its mechanisms and priors may publish —
    # |Y|, outputs, groups — an upper bound on the stored, packed document; 32 MiB is 4·10⁶ exact counts, e.g. 256
    # opt-unbiased randomizers on 88 labels).
    max_groups_per_release: int = Field(default=1000, gt=0)
    max_document_bytes: int = Field(default=32 << 20, gt=0)
    # Central training (400 training_too_large, from public inputs, before the charge): the whole run's work and one
    # step's, in example-rows × model parameters (labeldp_pro.training_size: the padded batch plus the denoiser's
    # rows, times the parameters shared.models.num_params counts). A running training cannot be stopped (the quota
    # debits its time only afterwards), so the size must bound it. Measured on 2 cores
    # (bench/central_training_size.py, altconv): 450 steps × 2,000 examples × a [64, 64] MLP (size 4.9·10⁹) in
    # 31 s, 20,000 steps × 700 × [64] (1.1·10¹⁰) in 59 s, 40 steps × 2,000 × [512, 512] (2.2·10¹⁰) not done after
    # 180 s: 5·10⁹ keeps a run within about a minute. One step holds its per-example gradients (~10 bytes of RSS per
    # unit: 2,000 rows × 268,290 parameters took 5.2 GB; a step of 1.1·10⁸, 1.3 GB): 10⁸ keeps it near 1 GB.
    max_central_training_size: int = Field(default=5_000_000_000, gt=0)
    max_central_training_step: int = Field(default=100_000_000, gt=0)
    # DuckDB's memory limit while an upload is checked and joined against the registry (it spills to the data
    # directory beyond it, so any upload fits): one thread per 128 MB (DuckDB's minimum), at least one, at most 2.
    upload_memory_mb: int = Field(default=128, ge=64)
    # The audit (docs/design/audit.md): the Ed25519 key that signs chain heads and key rows (a PEM file, mode 0600,
    # made by `labeldp labels audit-key`; keep it where a database writer cannot read it) and the directory where
    # every committed head is appended (heads.jsonl), best outside the database and the data directory. Unset, every
    # deployment still signs: the first process to start (a server or a command) makes the key under the data
    # directory (audit/audit-key.pem, 0600, never overwritten; its public key logged once) and exports to
    # audit/ beside it — an unsigned deployment would leave an outsider nothing to check.
    audit_key_file: Path | None = None
    audit_log_dir: Path | None = None
    # Source datasets (labels_party/releases/source.py): where Spark runs, and which locations each organization
    # may register (URI prefixes by organization name, as JSON). Empty: no source datasets on this deployment.
    spark_master: str = "local[*]"
    spark_sources: dict[str, list[str]] = Field(default_factory=dict)
    # A cluster master's shared authentication secret (a file of mode 0600; the master and workers read the same
    # one): Spark's RPC between the driver and executors is authenticated and encrypted with it. Required with a
    # master that is not local (shared/spark/session.py says why).
    spark_secret_file: Path | None = None
    # Durable jobs (labels_party/runtime/jobs.py: a source's registration, a source release's Spark job), run by every
    # `serve` process on the shared database under leases (shared/service/leases.py): a lease lasts
    # job_lease_seconds and is renewed every tenth of it — a killed replica's job is taken over by another within
    # about that long; idle workers look for jobs every job_poll_seconds; a job is claimed at most job_max_attempts
    # times (a failure is retried after job_retry_seconds), then it is failed; job_threads jobs run at once. An
    # uploaded dataset's release, computed in its request, holds such a lease too (labels_party/releases/liveness.py):
    # a replica killed while computing one has it failed by another within about job_lease_seconds +
    # job_poll_seconds.
    job_lease_seconds: float = Field(default=30.0, gt=0)
    job_poll_seconds: float = Field(default=1.0, gt=0)
    job_max_attempts: int = Field(default=3, ge=1)
    job_retry_seconds: float = Field(default=5.0, ge=0)
    job_threads: int = Field(default=1, ge=1, le=16)

    @property
    def audit_key_path(self) -> Path:
        """The audit key in use: the configured file, or the one made under the data directory."""
        return self.audit_key_file if self.audit_key_file is not None else Path(self.data_dir) / "audit" / \
            "audit-key.pem"

    @property
    def audit_log_path(self) -> Path:
        """Where signed heads are exported: the configured directory, or ``audit/`` under the data directory."""
        return self.audit_log_dir if self.audit_log_dir is not None else Path(self.data_dir) / "audit"

    @model_validator(mode="after")
    def _range_inside_what_mechanisms_certify(self) -> LabelsSettings:
        if not EPSILON_MIN <= self.epsilon_min < self.epsilon_max <= EPSILON_MAX:
            raise ValueError(f"need {EPSILON_MIN:g} <= epsilon_min < epsilon_max <= {EPSILON_MAX:g}")
        return self

    @model_validator(mode="after")
    def _a_columnar_body_fits_the_budget(self) -> LabelsSettings:
        if self.max_columnar_decoded_bytes > self.columnar_decode_budget_bytes:
            raise ValueError("max_columnar_decoded_bytes must be at most columnar_decode_budget_bytes")
        return self
