"""The ``labeldp`` command's parsers walked: every (sub)command as its path of names and its parser, so that a
test about "every command with --json" or "every range option" covers a command added later without a list."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from labeldp.cli import build_parser


def commands(parser: argparse.ArgumentParser | None = None,
             path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """(path, parser) of every command that runs (a parser without subcommands of its own)."""
    parser = build_parser() if parser is None else parser
    nested = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]  # argparse names no API
    if not nested:
        yield path, parser
    for action in nested:
        for name, sub in action.choices.items():
            yield from commands(sub, (*path, name))


def takes(parser: argparse.ArgumentParser, option: str) -> bool:
    return option in parser._option_string_actions
