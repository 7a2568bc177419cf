"""Deployment settings of the features-party trainer service, from ``LABELDP_TRAINER_*`` environment variables,
flags, or passed in (``labeldp features serve`` builds them).

The labels parties the trainer talks to are configuration, never a request field: a job names one of them (or
uses the default), so no request can make the trainer call an address of the caller's choosing.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from shared.errors import ErrorCode
from shared.service.limits import HttpSettings
from shared.service.sealing import SecretKeySettings

_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,39}$")


# The HTTP limits of `serve` (shared.service.limits) and the key that seals jobs' labels-party API keys
# (secret_key, secret_key_file: shared.service.sealing) are fields of this class too, defined and documented there.
class TrainerSettings(HttpSettings, SecretKeySettings):
    model_config = SettingsConfigDict(env_prefix="LABELDP_TRAINER_", frozen=True, extra="ignore")

    database_url: str = "sqlite:///var/trainer.db"
    data_dir: Path = Path("var/trainer")
    labels_parties: dict[str, str] = Field(default_factory=dict)  # name -> base URL (JSON in the environment)
    default_labels_party: str | None = None  # default: the first configured
    upstream_timeout_seconds: float = Field(default=90.0, gt=0, le=600)  # a release may solve up to a minute
    upstream_retries: int = Field(default=2, ge=0, le=5)
    upstream_ca_bundle: str | None = None  # verify the labels party's TLS certificate against this CA file
    max_features_bytes: int = Field(default=1 << 30, gt=0)
    max_json_bytes: int = Field(default=64 << 20, gt=0)
    # Id lists (any key of an organization uploads them): a body of at most max_id_list_bytes (64 MiB: some million
    # ids; beyond, 413), at most max_id_lists_per_org names per organization (a new one beyond: 409
    # too_many_id_lists; replacing a list is always allowed, DELETE frees a name).
    max_id_list_bytes: int = Field(default=64 << 20, gt=0)
    max_id_lists_per_org: int = Field(default=100, ge=1)
    # ... and at most max_id_list_ids ids (its lines, counted before it is parsed; beyond, 413 body_too_large): a
    # list is stored as a features table is, then sorted and hashed from its file in Arrow — 999,999 ids of 30
    # characters took the trainer up by 167 MB (issue 40's twelfth review: 335 MB read whole by pandas).
    max_id_list_ids: int = Field(default=1_000_000, gt=0)
    # Memory the process lends to requests that read a features table (a job is planned on its ids and columns,
    # in the request): each read takes what the table's metadata says those columns hold, waits up to 10 s for its
    # share (then 503 server_busy), and a table whose columns alone are more is refused (400 job_too_large). Issue
    # 40's eleventh review: four 124-byte jobs on a wide table took the trainer to 19.7 GB, killed by the kernel.
    table_read_budget_bytes: int = Field(default=512 << 20, gt=0)
    # A CSV body (features, id lists) is refused (413) before it is parsed when one of its records is longer than
    # max_csv_record_bytes (one 200 MB cell was read whole: +1,219 MB) or its header names more than
    # max_feature_columns columns (120,000 took 45 s of CPU and +1.1 GB). pandas spends ~0.1 ms of CPU a column
    # on each chunk it reads: a 1 MB table of 10,000 columns took 2.95 s of CPU to store, of 4,000 columns 1.01 s
    # (issue 40: at most 2 s for a body of 1 MB).
    max_csv_record_bytes: int = Field(default=1 << 20, gt=0)
    max_feature_columns: int = Field(default=4_000, gt=0)
    workers: int = Field(default=1, ge=1, le=64)  # job threads of this process (its JobRunner)
    # The jobs table is the queue (features_party.jobs): a worker holds a job under a lease its heartbeat renews
    # every tenth of job_lease_seconds; a job whose worker died is taken over by any replica once its lease
    # expired. Idle workers look for jobs every job_poll_seconds (a job created by this process wakes them at
    # once). A job claimed job_max_attempts times that is due again fails (job_attempts_exhausted). A job whose
    # labels party could not be reached or failed (5xx) is retried after upstream_retry_seconds, with the same
    # release key.
    job_lease_seconds: float = Field(default=30.0, ge=1, le=3600)
    job_poll_seconds: float = Field(default=1.0, gt=0, le=60)
    job_max_attempts: int = Field(default=5, ge=1, le=100)
    upstream_retry_seconds: float = Field(default=10.0, ge=0, le=3600)
    # Bounds per job and per organization, each checked before anything is asked of the labels party. The size of
    # a job is parameters × epochs × rows (× stages for lp-mst): 10¹² is minutes on a CPU core at batch ≥ 64, up to
    # about an hour at batch 1 (bench/train_throughput.py measures the rate); trees count in the same unit
    # (features_party.learn.gbdt.work; bench/train_throughput_gbdt.py measures both).
    max_job_size: float = Field(default=1e12, gt=0)  # beyond: 400 job_too_large
    # What a job holds besides its work, which max_job_size does not count (beyond either: 400 job_too_large): its
    # predictions, one number per row of its features table (not only those it trains on) and model output (a
    # class's probability; trees also hold a gradient per training row and class), and a tree job's memory in bytes
    # (features_party.learn.gbdt.memory: its model — rounds × trees per round × nodes per tree, ~64 bytes a node and ~7
    # per categorical level a split lists — XGBoost's cached histograms and the training matrices).
    max_prediction_cells: float = Field(default=1e8, gt=0)
    max_tree_bytes: float = Field(default=2e9, gt=0)
    # ... and an MLP job's memory in bytes (features_party.planning.mlp_memory: its parameters' copies — the model,
    # the optimizer's state, gradients, the kept best and the scan's carry —, a batch's activations and their
    # gradients per layer, the training matrices): issue 40, a job of 1.3·10⁸ parameters within max_job_size took
    # the trainer from 537 MB to 3.8 GB (~25 bytes a parameter).
    max_mlp_bytes: float = Field(default=2e9, gt=0)
    max_job_seconds: float = Field(default=1800.0, gt=0)  # a running job past it stops: failed, job_time_limit
    max_jobs_per_org: int = Field(default=4, ge=1)  # queued + running; beyond: 429 too_many_jobs + Retry-After
    min_train_examples: int = Field(default=10, ge=1)  # fewer to train on: 400 too_few_examples, nothing requested
    # A Spark cluster of the trainer's own (never the labels party's: its executors read true labels), where jobs
    # with "engine": "spark" boost their trees (features_party.learn.spark_trees): its master URL ("local[N]" runs
    # the executors in this process), the cluster's shared authentication secret (a file of mode 0600, which the
    # master and workers read too; required with a master that is not local), the XGBoost workers a job runs on
    # (executor tasks at once: at most the cluster's cores) and the memory each may hold of a job's rows.
    spark_master: str | None = None
    spark_secret_file: Path | None = None
    spark_workers: int = Field(default=2, ge=1, le=1024)
    spark_worker_memory_bytes: int = Field(default=1 << 30, gt=0)

    @field_validator("labels_parties")
    @classmethod
    def _urls(cls, parties: dict[str, str]) -> dict[str, str]:
        for name, url in parties.items():
            parts = urlsplit(url)
            if not _NAME.match(name):
                raise ValueError(f"labels-party name {name!r}: lower-case letters, digits, '-' and '_'")
            if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
                raise ValueError(f"labels-party URL {url!r} must be http(s)://host[:port][/path]")
        return {name: url.rstrip("/") for name, url in parties.items()}

    @model_validator(mode="after")
    def _default_is_configured(self) -> TrainerSettings:
        if self.default_labels_party is not None and self.default_labels_party not in self.labels_parties:
            raise ValueError(f"default labels party {self.default_labels_party!r} is not configured")
        return self

    def labels_party_url(self, name: str | None) -> tuple[str, str]:
        """(name, base URL) of a configured labels party; the default when ``name`` is None."""
        from shared.errors import LabelDPError

        if name is None:
            name = self.default_labels_party or next(iter(self.labels_parties), None)
        if name is None or name not in self.labels_parties:
            configured = ", ".join(self.labels_parties) or "none"
            raise LabelDPError(f"labels party {name!r} is not configured on this trainer (configured: {configured})",
                               code=ErrorCode.UNKNOWN_LABELS_PARTY)
        return name, self.labels_parties[name]
