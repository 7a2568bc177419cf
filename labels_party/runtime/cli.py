"""Labels-party subcommands: ``labeldp randomizer solve|audit`` and ``labeldp labels serve|verify-audit|audit-key|
upgrade-db`` with the key commands (``create-key``, ``list-keys``, ``revoke-key``, ``rotate-key``)."""

from __future__ import annotations

import csv
import json
import math
import time
from typing import TYPE_CHECKING

from shared.errors import ErrorCode, LabelDPError
from shared.service.commands import (
    LazyChoices,
    add_service_commands,
    check_shared_secret_key,
    check_workers,
    ensure_sqlite_directory,
    handle_keys,
)
from shared.service.tls import tls_options

if TYPE_CHECKING:  # the solvers, JAX and SciPy are imported by the commands that use them: `--help` stays fast
    import numpy as np

    from shared.domains import FiniteLabels


def _families() -> list[str]:
    from labels_party.core import registry

    return list(registry.FAMILIES)


def _solvers() -> list[str]:
    from typing import get_args

    from shared.schemas import Solver

    return list(get_args(Solver))


def register(commands) -> None:
    register_service_commands(commands)
    randomizer = commands.add_parser("randomizer", help="build and inspect label randomizers")
    actions = randomizer.add_subparsers(dest="action", required=True, parser_class=type(randomizer))
    solve = actions.add_parser("solve", help="build one certified randomizer for a known prior and report it")
    solve.add_argument("--mechanism", required=True, choices=LazyChoices(_families), metavar="MECHANISM",
                       help="one of: %(choices)s")
    solve.add_argument("--epsilon", required=True, type=str)
    solve.add_argument("--labels", required=True,
                       help="label domain: LOW:HIGH (integers), START:STOP:STEP, or a comma list")
    solve.add_argument("--prior-file", help="CSV with columns label,weight (a known prior; no ε spent). "
                                            "Default: uniform over the labels")
    solve.add_argument("--mesh", type=int, help="opt-unbiased: number of grid outputs (default 2|Y|)")
    solve.add_argument("--solver", choices=LazyChoices(_solvers), default=None, metavar="SOLVER",
                       help="opt-unbiased, one of %(choices)s: outputs anywhere in ℝ (cone program + HiGHS vertex, "
                            "certified gap) or on a mesh (one LP); default %(default)s")
    solve.add_argument("--clip", action="store_true", help="laplace/staircase: clip outputs to the label range")
    solve.add_argument("--json", action="store_true", help="print one JSON object")
    solve.add_argument("--show-matrix", action="store_true", help="include outputs and matrix in the JSON")
    solve.add_argument("--allow-uninformative", action="store_true",
                       help="research use: report a randomizer whose output does not depend on the label (e.g. "
                            "RRWithPrior keeping one class) instead of refusing it with uninformative_release")
    solve.set_defaults(handler=solve_command)
    audit = actions.add_parser("audit", help="sample a randomizer and report a 95%% lower bound on its epsilon "
                                             "next to the certified one")
    audit.add_argument("--mechanism", required=True, choices=LazyChoices(_families), metavar="MECHANISM",
                       help="one of: %(choices)s")
    audit.add_argument("--epsilon", required=True, type=str)
    audit.add_argument("--labels", required=True,
                       help="label domain: LOW:HIGH (integers), START:STOP:STEP, or a comma list; classification "
                            "mechanisms take 0:K-1 as K classes")
    audit.add_argument("--prior-file", help="CSV with columns label,weight (default: uniform)")
    audit.add_argument("--samples", type=int, default=1_000_000, help="draws per candidate label (default 10^6)")
    audit.add_argument("--seed", type=int, help="reproducible draws (default: the cryptographic source)")
    audit.add_argument("--json", action="store_true", help="print one JSON object")
    audit.set_defaults(handler=audit_command)


def read_prior_file(path: str, labels: FiniteLabels) -> np.ndarray:
    """Weights aligned with the domain's values; labels absent from the file get weight 0."""
    import numpy as np

    weights = np.zeros(labels.size)
    seen = set()
    try:
        with open(path, newline="") as handle:
            reader = csv.DictReader(handle)
            if reader.fieldnames is None or not {"label", "weight"} <= set(reader.fieldnames):
                raise LabelDPError(f"{path}: prior file needs a header with columns label,weight",
                                   code=ErrorCode.INVALID_PRIOR)
            for line, row in enumerate(reader, start=2):
                try:
                    label, weight = float(row["label"]), float(row["weight"])
                except (TypeError, ValueError):
                    raise LabelDPError(f"{path}:{line}: label and weight must be numbers",
                                       code=ErrorCode.INVALID_PRIOR) from None
                if not math.isfinite(weight) or weight < 0:
                    raise LabelDPError(f"{path}:{line}: weight must be finite and >= 0, got {row['weight']}",
                                       code=ErrorCode.INVALID_PRIOR)
                (index,), (found,) = labels.find([label])
                if not found:
                    raise LabelDPError(f"{path}:{line}: label {row['label']} is not in the label domain",
                                       code=ErrorCode.INVALID_PRIOR)
                if label in seen:
                    raise LabelDPError(f"{path}:{line}: duplicate label {row['label']}", code=ErrorCode.INVALID_PRIOR)
                seen.add(label)
                weights[index] = weight
    except FileNotFoundError:
        raise LabelDPError(f"prior file not found: {path}", code=ErrorCode.INVALID_PRIOR) from None
    if weights.sum() <= 0:
        raise LabelDPError(f"{path}: prior is empty or all weights are zero", code=ErrorCode.INVALID_PRIOR)
    return weights / weights.sum()


def _domain(mechanism: str, spec: str):
    """The label domain a --labels spec declares; classification mechanisms read 0:K-1 as K classes."""
    import numpy as np

    from labels_party.core import registry
    from shared.domains import Classes, parse_label_spec

    labels = parse_label_spec(spec)
    if registry.family(mechanism).label_kinds == registry.CLASSES:
        if not np.array_equal(labels.values, np.arange(labels.size)):
            raise LabelDPError(f"{mechanism} needs classes: --labels 0:K-1", code=ErrorCode.MECHANISM_DOMAIN_MISMATCH)
        return labels, Classes(labels.size)
    return labels, labels


def _print(report: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(report, allow_nan=False))  # one JSON document: never NaN or Infinity
        return
    width = max(len(k) for k in report)
    for key, value in report.items():
        print(f"{key:<{width}}  {value}")


def audit_command(args) -> int:
    import numpy as np

    from labels_party.core import registry
    from labels_party.core.privacy_audit import audit
    from shared.privacy import check_epsilon
    from shared.randomness import secure_rng

    epsilon = check_epsilon(args.epsilon)
    labels, domain = _domain(args.mechanism, args.labels)
    if args.samples < 100:
        raise LabelDPError(f"--samples must be at least 100, got {args.samples}", code=ErrorCode.INVALID_REQUEST)
    prior = read_prior_file(args.prior_file, labels) if args.prior_file else \
        np.full(labels.size, 1.0 / labels.size)
    family = registry.family(args.mechanism)
    mechanism = registry.build(args.mechanism, domain, epsilon, prior if family.needs_prior else None).mechanism
    rng = np.random.default_rng(args.seed) if args.seed is not None else secure_rng()
    started = time.perf_counter()
    result = audit(mechanism, labels.values, args.samples, rng)
    _print({**result.to_dict(), "epsilon": epsilon, "seconds": time.perf_counter() - started}, args.json)
    return 0


def solve_command(args) -> int:
    import numpy as np

    from labels_party.core import registry
    from shared.mechanisms.protocol import LabelRandomizer
    from shared.privacy import check_epsilon

    epsilon = check_epsilon(args.epsilon)
    labels, domain = _domain(args.mechanism, args.labels)
    if args.mesh is not None and args.mesh < 2:
        raise LabelDPError(f"--mesh must be at least 2, got {args.mesh}", code=ErrorCode.INVALID_MESH)
    prior = read_prior_file(args.prior_file, labels) if args.prior_file else \
        np.full(labels.size, 1.0 / labels.size)
    options = registry.MechanismOptions(mesh=args.mesh, clip=args.clip, solver=args.solver)
    family = registry.family(args.mechanism)
    started = time.perf_counter()
    built = registry.build(args.mechanism, domain, epsilon, prior if family.needs_prior else None, options)
    mechanism = built.mechanism
    seconds = time.perf_counter() - started
    if not args.allow_uninformative:
        registry.refuse_uninformative(mechanism, epsilon, prior_known=args.prior_file is not None)
    report = {
        "mechanism": mechanism.name,
        "epsilon": epsilon,
        "certified_epsilon": mechanism.certified_epsilon,
        **({"noisy_label_loss": mechanism.noisy_label_loss(prior), "max_abs_bias": mechanism.max_abs_bias}
           if isinstance(mechanism, LabelRandomizer) else {}),
        "num_outputs": mechanism.num_outputs,
        "solve_seconds": seconds,
        "num_labels": labels.size,
        "prior": args.prior_file or "uniform",
    }
    report.update({k: v for k, v in built.diagnostics.items() if k != "solve_seconds"})  # the solver's own
    if args.show_matrix:
        report["description"] = mechanism.describe()
    _print(report, args.json)
    return 0


def register_service_commands(commands) -> None:
    parsers = add_service_commands(
        commands, "labels", help="run and administer the labels-party service", port=8700, roles=("admin", "consumer"),
        database_help="SQLAlchemy URL (default: $LABELDP_DATABASE_URL or sqlite:///var/labels.db)",
        data_help="label and release files (default: $LABELDP_DATA_DIR or var/data)")
    verify = parsers.add("verify-audit", "recompute the ledger hash chains and budgets; with signed heads pinned "
                                         "earlier, prove the database was not rewritten or truncated since")
    verify.add_argument("--pinned", help="a file of signed heads (JSON lines: an exported heads.jsonl, or heads "
                                         "from GET /v1/audit/heads); without it, the heads log below is checked")
    verify.add_argument("--heads-log", help="the service's whole export of signed heads (its heads.jsonl), which "
                                            "must cover every ledger entry written since signing began; default: "
                                            "$LABELDP_AUDIT_LOG_DIR/heads.jsonl when it exists")
    verify.add_argument("--public-key", help="the audit public key (64 hex digits, as audit-key printed it); "
                                             "default: that of $LABELDP_AUDIT_KEY_FILE")
    key = parsers.actions.add_parser("audit-key", help="create the Ed25519 key that signs audit heads (mode 0600) "
                                                       "and print its public key")
    key.add_argument("--key-file", help="where to write it (default: $LABELDP_AUDIT_KEY_FILE); never overwritten")
    key.add_argument("--json", action="store_true", help="print one JSON object")
    key.set_defaults(handler=audit_key_command)
    parsers.serve.set_defaults(handler=serve_command)
    handle_keys(parsers, _keys)
    verify.set_defaults(handler=verify_audit_command)
    parsers.upgrade_db.set_defaults(handler=upgrade_db_command)  # budgets are converted, never reset


def _settings(args):
    from labels_party.runtime.settings import LabelsSettings

    overrides = {k: v for k, v in (("database_url", args.database_url), ("data_dir", args.data_dir)) if v}
    settings = LabelsSettings(**overrides)
    check_workers(getattr(args, "workers", 1), settings.database_url)  # serve: before a SQLite file is made
    ensure_sqlite_directory(settings.database_url)
    return settings


def _context(args, *, upgrade: bool = False):
    from labels_party.runtime.context import make_context

    return make_context(settings=_settings(args), upgrade=upgrade)


def upgrade_db_command(args) -> int:
    import json

    from labels_party.runtime.context import upgrade_database

    # the same path as serve --upgrade-db: the transitions its migrations append are signed, keys certified once
    upgraded = upgrade_database(_settings(args))
    print(json.dumps({"revision_before": upgraded.before, "revision_after": upgraded.after,
                      "keys_not_certified": list(upgraded.keys_not_certified)}))
    return 0


def serve_command(args) -> int:
    import logging

    from labels_party.http.api import create_app
    from shared.service.serving import configure_logging, log_storage, serve, serve_workers

    tls = tls_options(args)  # flags first: a usage error touches no database
    ctx = _context(args, upgrade=args.upgrade_db)  # a refusal to start (say, a restored database) is one line
    configure_logging()
    log_storage(logging.getLogger("labels_party"), ctx.settings.database_url, ctx.settings.data_dir)
    check_shared_secret_key(ctx.sealer, args.workers)
    if ctx.sealer.ephemeral:  # allowed (one process), never silent
        logging.getLogger("labels_party").warning(
            "no secret key (LABELDP_SECRET_KEY_FILE, made by `labeldp labels secret-key`): jobs' secrets are sealed "
            "with a key of this process only, so a job it leaves behind (a source release) cannot be run by another "
            "replica or after a restart: it fails with secret_key_missing")
    if args.workers == 1:
        serve(create_app(ctx, run_jobs=True), ctx.settings, host=args.host, port=args.port, **tls)  # HTTP limits
        return 0
    # Several processes: this one has migrated and checked the database (its refusals are one line, above); each
    # worker makes its own context from the same settings and runs its own job workers.
    ctx.close()
    return serve_workers(worker_app, ctx.settings, workers=args.workers, host=args.host, port=args.port,
                         data_dir=ctx.settings.data_dir, **tls)


def worker_app(settings):
    """One worker process's application (``serve --workers N``): its own context on the supervisor's settings."""
    from labels_party.http.api import create_app
    from labels_party.runtime.context import make_context

    return create_app(make_context(settings=settings), run_jobs=True)


def _keys(args):
    from labels_party.http.auth import key_ring

    ctx = _context(args)
    # keys made and revoked here are certified and go on the audit chain of every dataset their organization holds
    # an account on
    return key_ring(ctx.ledger), ctx.sessions


def verify_audit_command(args) -> int:
    from labels_party.ledger import Ledger, verification
    from labels_party.store import db, migrations
    from labels_party.store.storage import DataStore

    # Not a service context: the audit must also look at a database the service would refuse (one restored
    # behind its data directory reports that as a problem), and it repairs nothing.
    settings = _settings(args)
    pinned, public, heads_log = _pinned(args, settings)
    report = verification.verify(migrations.make_sessionmaker(db.make_engine(settings.database_url)),
                                 Ledger(DataStore(settings.data_dir)), pinned=pinned, public_key=public,
                                 heads_log=heads_log, max_document_bytes=settings.max_document_bytes)
    print(json.dumps(report, indent=2))
    return 0 if report["valid"] else 1


def _pinned(args, settings):
    """The signed heads to check (a file given, else the configured export), the public key they verify with, and
    how to read the service's whole export of transitions (``--heads-log``, else the configured one), which must
    cover every entry written since signing began."""
    from pathlib import Path

    from labels_party.ledger import signing

    exported = Path(args.heads_log) if args.heads_log else settings.audit_log_path / signing.LOG_NAME
    if exported is not None and not args.heads_log and not exported.exists():
        exported = None
    if args.pinned is None and exported is None:
        if args.public_key:  # an outsider with the key: a log deleted is not "nothing to check" but every entry
            # unsigned (the review of issue 40: a whole-chain rewrite with the log removed verified valid)
            return None, signing.parse_public_key(args.public_key), list
        return None, None, None
    if args.public_key:
        public = signing.parse_public_key(args.public_key)
    elif settings.audit_key_path.exists():
        public = signing.load_key_file(settings.audit_key_path).public_key()
    else:
        raise LabelDPError("checking signed heads needs the audit public key (--public-key)", code=ErrorCode.USAGE)
    # Without --pinned the export is checked as the heads log (every transition in it, both ends in the chain):
    # pinning it too would check each head twice.
    pinned = signing.read_heads(Path(args.pinned)) if args.pinned else None
    return pinned, public, None if exported is None else (lambda: signing.read_heads(exported))


def audit_key_command(args) -> int:
    from pathlib import Path

    from labels_party.ledger import signing
    from labels_party.runtime.settings import LabelsSettings

    path = Path(args.key_file) if args.key_file else LabelsSettings().audit_key_path
    public = signing.create_key_file(path)  # the private key is written to the file only, never printed
    if args.json:
        print(json.dumps({"public_key": signing.public_hex(public), "key_id": signing.key_id(public)}))
    else:
        print(signing.public_hex(public))
    return 0
