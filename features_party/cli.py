"""Features-party subcommands: ``labeldp features serve|upgrade-db`` with the key commands (``create-key``,
``list-keys``, ``revoke-key``, ``rotate-key``), ``labeldp predict``, and ``labeldp quantiles`` — a client of a
labels party (:class:`~features_party.client.LabelsPartyClient`): DP quantiles of a dataset's labels, to choose
its clip bounds privately."""

from __future__ import annotations

import os
import sys

from shared.errors import ErrorCode, LabelDPError
from shared.service.commands import (
    add_service_commands,
    check_shared_secret_key,
    check_workers,
    ensure_sqlite_directory,
    handle_keys,
    upgrade_database,
)
from shared.service.tls import tls_options

KEY_VARIABLE = "LABELDP_API_KEY"  # labeldp quantiles' key when --key is not given (keeps it out of ps)


def register(commands) -> None:
    parsers = add_service_commands(
        commands, "features", help="run the features-party trainer service", port=8701, roles=("admin", "member"),
        database_help="SQLAlchemy URL (default: $LABELDP_TRAINER_DATABASE_URL or sqlite:///var/trainer.db)",
        data_help="features, models and predictions (default: $LABELDP_TRAINER_DATA_DIR or var/trainer)")
    parsers.serve.add_argument(
        "--labels-party", action="append", default=None, metavar="NAME=URL",
        help="a labels party jobs may use (repeatable; the first is the default unless --default-labels-party says "
             "otherwise); default: $LABELDP_TRAINER_LABELS_PARTIES")
    parsers.serve.add_argument("--default-labels-party", default=None)
    parsers.serve.set_defaults(handler=serve_command)
    handle_keys(parsers, _keys)
    parsers.upgrade_db.set_defaults(handler=upgrade_db_command)
    imported = parsers.add("import-features", "import a features table from Parquet files (larger than memory: "
                                              "jobs train on it from disk)")
    imported.add_argument("--org", required=True, help="the organization that owns the table")
    imported.add_argument("--name", required=True, help="the table's name (replaces a table of that name)")
    imported.add_argument("path", help="a Parquet file, or a directory of them (walked; links are not followed)")
    imported.add_argument("--json", action="store_true", help="print the table as one JSON object")
    imported.set_defaults(handler=import_features_command)

    predict = commands.add_parser("predict", help="predict with a saved model")
    predict.add_argument("--model", required=True, help="model .npz written by a training job")
    predict.add_argument("--features", required=True, help="features CSV with an example_id column")
    predict.add_argument("--out", required=True, help="output CSV (example_id, prediction[, p_class_k...])")
    predict.set_defaults(handler=predict_command)

    quantiles = commands.add_parser(
        "quantiles", help="DP quantiles of a dataset's labels at a labels party (to choose clip bounds privately)",
        description="Ask a labels party for DP quantiles of a dataset's labels on its declared domain: one exact "
        "exponential-mechanism draw per quantile among the domain's values (integers, listed values or the "
        "continuous grid), epsilon split evenly across the quantiles and charged to every covered example. The "
        "same --idempotency-key sent again returns the same values, charged once.")
    quantiles.add_argument("--url", required=True, help="the labels party, e.g. http://127.0.0.1:8700")
    quantiles.add_argument("--key", default=os.environ.get(KEY_VARIABLE), required=not os.environ.get(KEY_VARIABLE),
                           help=f"an API key that sees the dataset (default: ${KEY_VARIABLE})")
    quantiles.add_argument("--dataset", required=True, help="the dataset id")
    quantiles.add_argument("--quantiles", required=True, metavar="Q,Q,...",
                           help="strictly increasing, each in (0, 1), e.g. 0.01,0.99")
    quantiles.add_argument("--epsilon", required=True, type=float, help="charged to every covered example")
    quantiles.add_argument("--example-ids", metavar="FILE",
                           help="only these examples' labels: one id a line (a first line 'example_id' is a header); "
                                "default: every label of the dataset")
    quantiles.add_argument("--idempotency-key", help="default: a new random one")
    quantiles.add_argument("--cacert", help="the labels party's CA bundle (https)")
    quantiles.add_argument("--json", action="store_true", help="print the release as one JSON document")
    quantiles.set_defaults(handler=quantiles_command)


def _settings(args):
    from features_party.settings import TrainerSettings

    overrides = {k: v for k, v in (("database_url", args.database_url), ("data_dir", args.data_dir)) if v}
    if getattr(args, "labels_party", None):
        parties = {}
        for item in args.labels_party:
            name, sep, url = item.partition("=")
            if not sep:
                raise LabelDPError(f"--labels-party takes NAME=URL, got {item!r}", code=ErrorCode.USAGE)
            parties[name.strip()] = url.strip()
        overrides["labels_parties"] = parties
    if getattr(args, "default_labels_party", None):
        overrides["default_labels_party"] = args.default_labels_party
    try:
        settings = TrainerSettings(**overrides)
    except ValueError as err:
        raise LabelDPError(f"invalid trainer settings: {str(err).splitlines()[-1].strip()}",
                           code=ErrorCode.USAGE) from None
    check_workers(getattr(args, "workers", 1), settings.database_url)  # serve: before a SQLite file is made
    ensure_sqlite_directory(settings.database_url)
    return settings


def serve_command(args) -> int:
    import logging

    from features_party.api import create_app
    from features_party.learn.train import device_summary
    from features_party.process import make_context
    from shared.service.serving import configure_logging, log_storage, serve, serve_workers

    tls = tls_options(args)  # flags first: a usage error touches no database
    settings = _settings(args)
    configure_logging()
    log = logging.getLogger("labeldp.features")
    log.info("JAX devices: %s", device_summary())
    log.info("labels parties: %s", ", ".join(f"{k}={v}" for k, v in settings.labels_parties.items()) or "none")
    log_storage(log, settings.database_url, settings.data_dir)
    ctx = make_context(settings, upgrade=args.upgrade_db)  # migrates and checks once; a refusal is one line
    check_shared_secret_key(ctx.sealer, args.workers)
    if ctx.sealer.ephemeral:
        log.warning("no secret key (secret_key_file): jobs this process leaves unfinished cannot be run by another "
                    "process until they are resumed with their api_key; replicas need one shared key")
    if args.workers == 1:
        serve(create_app(ctx, run_jobs=True), settings, host=args.host, port=args.port, **tls)  # the HTTP limits
        return 0
    # Several processes: each worker makes its own context from the same settings and runs its own job workers.
    ctx.close()
    return serve_workers(worker_app, settings, workers=args.workers, host=args.host, port=args.port,
                         data_dir=settings.data_dir, **tls)


def worker_app(settings):
    """One worker process's application (``serve --workers N``): its own context on the supervisor's settings."""
    from features_party.api import create_app
    from features_party.process import make_context

    return create_app(make_context(settings), run_jobs=True)


def _keys(args):
    from features_party.auth import KEYS
    from features_party.migrations import make_sessionmaker
    from shared.service.database import make_engine

    return KEYS, make_sessionmaker(make_engine(_settings(args).database_url))


def import_features_command(args) -> int:
    import json
    import re
    from pathlib import Path

    from features_party import schemas
    from features_party.feature_datasets import import_features
    from features_party.process import make_context

    if not re.fullmatch(schemas.NAME_PATTERN, args.name):
        raise LabelDPError(f"--name takes letters, digits, '-' and '_', not {args.name!r}", code=ErrorCode.USAGE)
    ctx = make_context(_settings(args))
    try:
        view = import_features(ctx, args.org, args.name, Path(args.path))
    finally:
        ctx.close()
    if args.json:
        print(json.dumps(view.model_dump(mode="json")))
    else:
        print(f"features table {view.name}: {view.num_examples:,} rows, {len(view.columns) - 1} feature columns")
    return 0


def upgrade_db_command(args) -> int:
    from features_party.migrations import MIGRATIONS
    from shared.service.database import make_engine

    return upgrade_database(MIGRATIONS, make_engine(_settings(args).database_url))


def predict_command(args) -> int:
    from features_party.features import read_features
    from features_party.jobs import predictions_frame

    if not os.path.exists(args.model):
        raise LabelDPError(f"model file not found: {args.model}", code=ErrorCode.NOT_FOUND)
    if not os.path.exists(args.features):
        raise LabelDPError(f"features file not found: {args.features}", code=ErrorCode.NOT_FOUND)
    frame = predictions_frame(args.model, read_features(args.features))
    frame.to_csv(args.out, index=False)
    print(f"wrote {len(frame)} predictions to {args.out}")
    return 0


def parse_quantiles(text: str) -> list[float]:
    try:
        return [float(part) for part in text.split(",")]
    except ValueError:
        raise LabelDPError(f"--quantiles takes numbers separated by commas, e.g. 0.01,0.99, not {text!r}",
                           code=ErrorCode.USAGE) from None


def _read_ids(path: str) -> list[str]:
    with open(path) as handle:
        ids = [line.strip() for line in handle if line.strip()]
    return ids[1:] if ids[:1] == ["example_id"] else ids


def _exact(value: float) -> str:
    """The shortest text that reads back as ``value`` (an integer without its ".0")."""
    text = repr(value)
    return text[:-2] if text.endswith(".0") else text


def quantiles_command(args) -> int:
    import json

    import httpx
    from pydantic import ValidationError

    from features_party.client import LabelsPartyClient, LabelsPartyError, quantile_values

    quantiles = parse_quantiles(args.quantiles)
    example_ids = _read_ids(args.example_ids) if args.example_ids else None
    try:
        with LabelsPartyClient(args.url, args.key, verify=args.cacert or True) as client:
            release = client.request_quantiles(args.dataset, quantiles, args.epsilon, example_ids=example_ids,
                                               idempotency_key=args.idempotency_key)
    except ValidationError as err:  # the request's own schema, checked before it is sent
        first = err.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise LabelDPError(f"{where}: {first['msg']}", code=ErrorCode.USAGE) from None
    except LabelsPartyError as err:
        code = ErrorCode.LABELS_PARTY_REFUSED if 400 <= err.status < 500 else ErrorCode.LABELS_PARTY_FAILED
        raise LabelDPError(f"the labels party answered {err.status} {err.safe_code}: {err.message}", code=code) \
            from None
    except httpx.HTTPError as err:
        raise LabelDPError(f"cannot reach the labels party at {args.url}: {err}",
                           code=ErrorCode.LABELS_PARTY_UNREACHABLE) \
            from None
    if args.json:
        print(json.dumps(release.model_dump(mode="json"), allow_nan=False))
        return 0
    for q, value in quantile_values(release).items():  # the value exactly (a shell script may declare it a clip)
        print(f"{q:g}\t{_exact(value)}")
    print(f"epsilon {release.charged_epsilon:g} charged to each of {release.num_examples} examples "
          f"(release {release.id})", file=sys.stderr)
    return 0
