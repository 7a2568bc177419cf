"""Features-party subcommands: ``labeldp features serve|upgrade-db`` with the key commands (``create-key``,
``list-keys``, ``revoke-key``, ``rotate-key``), and ``labeldp predict``."""

from __future__ import annotations

import os

from shared.errors import LabelDPError
from shared.service.commands import (
    add_service_commands,
    check_shared_secret_key,
    check_workers,
    ensure_sqlite_directory,
    handle_keys,
    upgrade_database,
)
from shared.service.tls import tls_options


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

    predict = commands.add_parser("predict", help="predict with a saved model")
    predict.add_argument("--model", required=True, help="model .npz written by a training job")
    predict.add_argument("--features", required=True, help="features CSV with an example_id column")
    predict.add_argument("--out", required=True, help="output CSV (example_id, prediction[, p_class_k...])")
    predict.set_defaults(handler=predict_command)


def _settings(args):
    from features_party.settings import TrainerSettings

    overrides = {k: v for k, v in (("database_url", args.database_url), ("data_dir", args.data_dir)) if v}
    if getattr(args, "labels_party", None):
        parties = {}
        for item in args.labels_party:
            name, sep, url = item.partition("=")
            if not sep:
                raise LabelDPError(f"--labels-party takes NAME=URL, got {item!r}", code="usage")
            parties[name.strip()] = url.strip()
        overrides["labels_parties"] = parties
    if getattr(args, "default_labels_party", None):
        overrides["default_labels_party"] = args.default_labels_party
    try:
        settings = TrainerSettings(**overrides)
    except ValueError as err:
        raise LabelDPError(f"invalid trainer settings: {str(err).splitlines()[-1].strip()}", code="usage") from None
    check_workers(getattr(args, "workers", 1), settings.database_url)  # serve: before a SQLite file is made
    ensure_sqlite_directory(settings.database_url)
    return settings


def serve_command(args) -> int:
    import logging

    from features_party.api import create_app
    from features_party.process import make_context
    from features_party.train import device_summary
    from shared.service.serving import configure_logging, serve, serve_workers

    tls = tls_options(args)  # flags first: a usage error touches no database
    settings = _settings(args)
    configure_logging()
    log = logging.getLogger("labeldp.features")
    log.info("JAX devices: %s", device_summary())
    log.info("labels parties: %s", ", ".join(f"{k}={v}" for k, v in settings.labels_parties.items()) or "none")
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
    return serve_workers(worker_app, settings, workers=args.workers, host=args.host, port=args.port, **tls)


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


def upgrade_db_command(args) -> int:
    from features_party.migrations import MIGRATIONS
    from shared.service.database import make_engine

    return upgrade_database(MIGRATIONS, make_engine(_settings(args).database_url))


def predict_command(args) -> int:
    from features_party.features import read_features
    from features_party.jobs import predictions_frame

    if not os.path.exists(args.model):
        raise LabelDPError(f"model file not found: {args.model}", code="not_found")
    if not os.path.exists(args.features):
        raise LabelDPError(f"features file not found: {args.features}", code="not_found")
    frame = predictions_frame(args.model, read_features(args.features))
    frame.to_csv(args.out, index=False)
    print(f"wrote {len(frame)} predictions to {args.out}")
    return 0
