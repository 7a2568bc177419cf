"""Features-party subcommands: ``labeldp features serve|create-key|upgrade-db`` and ``labeldp predict``."""

from __future__ import annotations

import os

from shared.errors import LabelDPError
from shared.service.tls import add_tls_arguments, tls_options


def register(commands) -> None:
    features = commands.add_parser("features", help="run the features-party trainer service")
    actions = features.add_subparsers(dest="action", required=True, parser_class=type(features))
    common = {"--database-url": dict(default=None, help="SQLAlchemy URL (default: $LABELDP_TRAINER_DATABASE_URL or "
                                                        "sqlite:///var/trainer.db)"),
              "--data-dir": dict(default=None, help="features, models and predictions (default: "
                                                    "$LABELDP_TRAINER_DATA_DIR or var/trainer)")}
    serve = actions.add_parser("serve", help="start the trainer HTTP service (loopback unless --host says otherwise)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8701)
    serve.add_argument("--labels-party", action="append", default=None, metavar="NAME=URL",
                       help="a labels party jobs may use (repeatable; the first is the default unless "
                            "--default-labels-party says otherwise); default: $LABELDP_TRAINER_LABELS_PARTIES")
    serve.add_argument("--default-labels-party", default=None)
    serve.add_argument("--upgrade-db", action="store_true", help="migrate an older database schema first")
    add_tls_arguments(serve)
    key = actions.add_parser("create-key", help="create a trainer API key (printed once on stdout)")
    key.add_argument("--org", required=True)
    key.add_argument("--role", required=True, choices=("admin", "member"))
    upgrade = actions.add_parser("upgrade-db", help="migrate the trainer database to this version's schema")
    for sub in (serve, key, upgrade):
        for flag, kwargs in common.items():
            sub.add_argument(flag, **kwargs)
    serve.set_defaults(handler=serve_command)
    key.set_defaults(handler=create_key_command)
    upgrade.set_defaults(handler=upgrade_db_command)

    predict = commands.add_parser("predict", help="predict with a saved model")
    predict.add_argument("--model", required=True, help="model .npz written by a training job")
    predict.add_argument("--features", required=True, help="features CSV with an example_id column")
    predict.add_argument("--out", required=True, help="output CSV (example_id, prediction[, p_class_k...])")
    predict.set_defaults(handler=predict_command)


def _settings(args):
    from pathlib import Path

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
    if settings.database_url.startswith("sqlite:///"):
        Path(settings.database_url[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
    return settings


def serve_command(args) -> int:
    import logging

    import uvicorn

    from features_party.api import create_app
    from features_party.service import make_context
    from features_party.train import device_summary

    tls = tls_options(args)  # flags first: a usage error touches no database
    settings = _settings(args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    log = logging.getLogger("labeldp.features")
    log.info("JAX devices: %s", device_summary())
    log.info("labels parties: %s", ", ".join(f"{k}={v}" for k, v in settings.labels_parties.items()) or "none")
    uvicorn.run(create_app(make_context(settings, upgrade=args.upgrade_db)), host=args.host, port=args.port,
                log_level="info", **tls)
    return 0


def create_key_command(args) -> int:
    from features_party import db
    from features_party.auth import create_key
    from shared.service.database import make_engine

    sessions = db.make_sessionmaker(make_engine(_settings(args).database_url))
    with sessions() as session, session.begin():
        print(create_key(session, args.org, args.role))
    return 0


def upgrade_db_command(args) -> int:
    import json

    from features_party.migrations import MIGRATIONS
    from shared.service.database import make_engine

    before, after = MIGRATIONS.upgrade(make_engine(_settings(args).database_url))
    print(json.dumps({"revision_before": before, "revision_after": after}))
    return 0


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
