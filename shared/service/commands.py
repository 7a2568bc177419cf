"""The commands every party's service has — ``serve``, ``upgrade-db``, ``secret-key`` and the key commands
``create-key``, ``list-keys``, ``revoke-key`` and ``rotate-key`` — with the same database and data-directory flags,
the same TLS flags and the same behaviour; each party adds its own handlers (the key commands' through
:func:`handle_keys`) and any further subcommands.

A key's secret is printed once, on stdout, and nowhere else (no log, no stderr); ``--json`` prints exactly one
JSON document."""

from __future__ import annotations

import argparse
import getpass
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from shared.errors import ErrorCode, LabelDPError
from shared.service.tls import add_tls_arguments

if TYPE_CHECKING:  # the key ring and SQLAlchemy are imported by the commands that run: `--help` stays fast
    from sqlalchemy.orm import Session

    from shared.service.keys import IssuedKey, KeyInfo, KeyRing

    KeyOpener = Callable[[argparse.Namespace], tuple[KeyRing, Callable[[], Session]]]


@dataclass(frozen=True)
class ServiceParsers:
    """The ``labeldp <party>`` subcommand parsers; :meth:`add` makes one more with the storage flags."""

    actions: argparse._SubParsersAction  # argparse's subparsers action (no public name for its type)
    storage_flags: dict
    serve: argparse.ArgumentParser
    create_key: argparse.ArgumentParser
    upgrade_db: argparse.ArgumentParser
    list_keys: argparse.ArgumentParser
    revoke_key: argparse.ArgumentParser
    rotate_key: argparse.ArgumentParser

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
    """``labeldp <party> serve|upgrade-db|create-key|list-keys|revoke-key|rotate-key`` (loopback by default; a key
    is printed once)."""
    parser = commands.add_parser(party, help=help)
    actions = parser.add_subparsers(dest="action", required=True, parser_class=type(parser))
    storage = {"--database-url": dict(default=None, help=database_help),
               "--data-dir": dict(default=None, help=data_help)}
    serve = _subcommand(actions, storage, "serve", "start the HTTP service (loopback unless --host says otherwise)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=port)
    serve.add_argument("--upgrade-db", action="store_true", help="migrate an older database schema first")
    serve.add_argument("--workers", type=_workers, default=1, metavar="N",
                       help="server processes sharing the port (default 1); more than one needs PostgreSQL")
    add_tls_arguments(serve)
    key = _subcommand(actions, storage, "create-key", "create an API key (printed once on stdout)")
    key.add_argument("--org", required=True)
    key.add_argument("--role", required=True, choices=roles)
    _expiry_arguments(key, "the key expires (default: never)")
    upgrade = _subcommand(actions, storage, "upgrade-db", "migrate the database to this version's schema (Alembic)")
    listing = _subcommand(actions, storage, "list-keys",
                          "list API keys: id, prefix, organization, role, created, expires, revoked (never a secret)")
    listing.add_argument("--org", help="only this organization's keys")
    revoke = _subcommand(actions, storage, "revoke-key", "revoke an API key now (every request with it is then 401)")
    _key_reference(revoke)
    rotate = _subcommand(actions, storage, "rotate-key", "issue a new key of the same organization and role "
                                                         "(printed once on stdout) and revoke the old one")
    _key_reference(rotate)
    rotate.add_argument("--grace-hours", type=float, default=0.0,
                        help="the old key keeps working this long (at most 720; default 0: revoked now)")
    _expiry_arguments(rotate, "the new key expires (default: after the old key's lifetime; never if it had none)")
    for parser in (key, listing, revoke, rotate):
        parser.add_argument("--json", action="store_true", help="print one JSON object")
    secret = actions.add_parser("secret-key", help="create the key that seals jobs' secrets (32 random bytes, "
                                                   "base64, a new file of mode 0600; printed nowhere)")
    secret.add_argument("--key-file", required=True, help="where to write it (never overwritten); point the "
                                                          "service's secret_key_file setting at it")
    secret.set_defaults(handler=_secret_key)
    return ServiceParsers(actions, storage, serve, key, upgrade, listing, revoke, rotate)


def _secret_key(args: argparse.Namespace) -> int:
    from shared.service.sealing import write_key_file

    write_key_file(Path(args.key_file))
    print(f"wrote a new secret key to {args.key_file}", file=sys.stderr)
    return 0


def _workers(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"a whole number of processes, at least 1, is needed, not {text!r}")
    return int(text)


def check_shared_secret_key(sealer, workers: int) -> None:
    """``serve --workers N``: the workers run each other's jobs, so they must open each other's sealed secrets."""
    if workers > 1 and sealer.ephemeral:
        raise LabelDPError(f"--workers {workers} needs a secret key the workers share (secret_key_file, made by "
                           "`labeldp <party> secret-key`): a key of one process only cannot open another's jobs",
                           code=ErrorCode.USAGE)


def check_workers(workers: int, database_url: str) -> None:
    """``serve --workers N``: several processes share one database, which SQLite cannot serve them (a file's
    writers wait on one lock, and its WAL is per host); refused before anything is opened or created."""
    if workers > 1 and database_url.startswith("sqlite"):
        raise LabelDPError(f"--workers {workers} needs a PostgreSQL database (--database-url); SQLite serves one "
                           "process: use --workers 1", code=ErrorCode.USAGE)


def _expiry_arguments(parser: argparse.ArgumentParser, what: str) -> None:
    when = parser.add_mutually_exclusive_group()
    when.add_argument("--expires-in", type=float, metavar="DAYS", help=f"{what} after this many days")
    when.add_argument("--expires-at", metavar="ISO_DATE", help=f"{what} at this ISO 8601 date or date-time (UTC "
                                                               "unless it names a zone)")


def _key_reference(parser: argparse.ArgumentParser) -> None:
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--id", type=int, help="the key's id (list-keys)")
    which.add_argument("--prefix", help="the key's public prefix: its middle part, e.g. 1a2b3c4d")
    parser.add_argument("--by", default=None, help="who revokes, for the record (default: the login name)")


def _operator(args: argparse.Namespace) -> str:
    if args.by is not None:
        return args.by
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no login name (a container's user without a passwd entry)
        return "unknown operator"


class LazyChoices(Sequence[str]):
    """An option's choices, computed the first time they are read (a parse, or that command's ``--help``): listing
    them must not import what computes them for every other command (``labeldp --help`` imports no solver). Give the
    option a ``metavar``, since argparse reads the choices to make one."""

    def __init__(self, load: Callable[[], list[str]]) -> None:
        self._load: Callable[[], list[str]] = load
        self._items: list[str] | None = None

    def _loaded(self) -> list[str]:
        if self._items is None:
            self._items = list(self._load())
        return self._items

    def __getitem__(self, index):
        return self._loaded()[index]

    def __len__(self) -> int:
        return len(self._loaded())

    def __contains__(self, item: object) -> bool:
        return item in self._loaded()

    def __iter__(self) -> Iterator[str]:
        return iter(self._loaded())


def handle_keys(parsers: ServiceParsers, open_keys: KeyOpener) -> None:
    """The key commands' handlers over the party's key ring and database sessions (``open_keys(args)``)."""

    def create(args: argparse.Namespace) -> int:
        from shared.service.keys import expiry  # here, not at registration: `--help` opens no key ring

        expires_at = expiry(days=args.expires_in, at=args.expires_at)  # flags first: a usage error opens nothing
        keys, sessions = open_keys(args)
        with sessions() as session, session.begin():
            issued = keys.issue(session, args.org, args.role, expires_at=expires_at)
        _print_issued(issued, None, args.json)
        return 0

    def listing(args: argparse.Namespace) -> int:
        keys, sessions = open_keys(args)
        with sessions() as session, session.begin():
            found = keys.list_keys(session, args.org)
        if args.json:
            print(json.dumps({"keys": [k.to_dict() for k in found]}))
        else:
            for info in found:
                print(_describe(info))
        return 0

    def revoke(args: argparse.Namespace) -> int:
        from shared.service.keys import KeyRef

        ref = KeyRef(args.id, args.prefix)
        keys, sessions = open_keys(args)
        with sessions() as session, session.begin():
            revoked = keys.revoke(session, ref, by=_operator(args))
        print(json.dumps(revoked.to_dict()) if args.json else f"revoked {_describe(revoked)}")
        return 0

    def rotate(args: argparse.Namespace) -> int:
        from shared.service.keys import KeyRef, expiry

        ref = KeyRef(args.id, args.prefix)
        expires_at = expiry(days=args.expires_in, at=args.expires_at)
        if not 0 <= args.grace_hours <= 720:  # also refuses NaN
            raise LabelDPError(f"--grace-hours lies in [0, 720], got {args.grace_hours}", code=ErrorCode.USAGE)
        keys, sessions = open_keys(args)
        with sessions() as session, session.begin():
            issued, old = keys.rotate(session, ref, by=_operator(args), grace=timedelta(hours=args.grace_hours),
                                      expires_at=expires_at)
        _print_issued(issued, old, args.json)
        return 0

    parsers.create_key.set_defaults(handler=create)
    parsers.list_keys.set_defaults(handler=listing)
    parsers.revoke_key.set_defaults(handler=revoke)
    parsers.rotate_key.set_defaults(handler=rotate)


def _describe(info: KeyInfo) -> str:
    def when(value) -> str:
        return "-" if value is None else f"{value:%Y-%m-%dT%H:%M:%SZ}"

    revoked = f"  revoked {when(info.revoked_at)} by {info.revoked_by}" if info.revoked_at else ""
    return (f"id {info.id}  prefix {info.prefix}  {info.organization}  {info.role}  {info.status}  "
            f"created {when(info.created_at)}  expires {when(info.expires_at)}{revoked}")


def _print_issued(issued: IssuedKey, replaced: KeyInfo | None, as_json: bool) -> None:
    """The new secret, once, on stdout: alone (``KEY=$(labeldp ... create-key ...)``) or in the one JSON document;
    what happened to a replaced key goes to stderr, so stdout stays the key."""
    if as_json:
        print(json.dumps({"key": issued.secret, **issued.info.to_dict(),
                          **({"replaced": replaced.to_dict()} if replaced is not None else {})}))
        return
    print(issued.secret)
    if replaced is not None:
        print(f"new key id {issued.info.id} prefix {issued.info.prefix}; replaced {_describe(replaced)}",
              file=sys.stderr)


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
