"""The commands every party's service has — ``serve``, ``create-key`` and ``upgrade-db`` — with the same database
and data-directory flags, the same TLS flags and the same behaviour; each party adds its own handlers and any
further subcommands."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from shared.service.tls import add_tls_arguments


@dataclass(frozen=True)
class ServiceParsers:
    """The ``labeldp <party>`` subcommand parsers; :meth:`add` makes one more with the storage flags."""

    actions: argparse._SubParsersAction  # argparse's subparsers action (no public name for its type)
    storage_flags: dict
    serve: argparse.ArgumentParser
    create_key: argparse.ArgumentParser
    upgrade_db: argparse.ArgumentParser

    def add(self, name: str, help: str) -> argparse.ArgumentParser:
        return _subcommand(self.actions, self.storage_flags, name, help)


def _subcommand(actions: argparse._SubParsersAction, storage_flags: dict, name: str,
                help: str) -> argparse.ArgumentParser:
    parser = actions.add_parser(name, help=help)
    for flag, kwargs in storage_flags.items():
        parser.add_argument(flag, **kwargs)
    return parser


def add_service_commands(commands, party: str, *, help: str, port: int, roles: tuple[str, ...],
                         database_help: str, data_help: str) -> ServiceParsers:
    """``labeldp <party> serve|create-key|upgrade-db`` (loopback by default; a key is printed once)."""
    parser = commands.add_parser(party, help=help)
    actions = parser.add_subparsers(dest="action", required=True, parser_class=type(parser))
    storage = {"--database-url": dict(default=None, help=database_help),
               "--data-dir": dict(default=None, help=data_help)}
    serve = _subcommand(actions, storage, "serve", "start the HTTP service (loopback unless --host says otherwise)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=port)
    serve.add_argument("--upgrade-db", action="store_true", help="migrate an older database schema first")
    add_tls_arguments(serve)
    key = _subcommand(actions, storage, "create-key", "create an API key (printed once on stdout)")
    key.add_argument("--org", required=True)
    key.add_argument("--role", required=True, choices=roles)
    upgrade = _subcommand(actions, storage, "upgrade-db", "migrate the database to this version's schema (Alembic)")
    return ServiceParsers(actions, storage, serve, key, upgrade)


def ensure_sqlite_directory(database_url: str) -> None:
    """A SQLite file's folder is created on first use (other databases are the operator's)."""
    if database_url.startswith("sqlite:///"):
        Path(database_url[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)


def upgrade_database(migrations, engine, data_dir: str | Path | None = None) -> int:
    """Run the party's Alembic migrations (data migrations rewrite files in ``data_dir``) and print the revisions
    before and after as one JSON object."""
    before, after = migrations.upgrade(engine, data_dir)
    print(json.dumps({"revision_before": before, "revision_after": after}))
    return 0
