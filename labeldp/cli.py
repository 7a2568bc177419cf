"""The ``labeldp`` command, the composition root: each party contributes its own subcommands, and the commands
that play both parties (benchmarks, the demo) come from this package. A deployment image holds only one party
(``deploy/*.Dockerfile``), so a party whose package is absent contributes nothing. Errors become one line on
stderr."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import os
import re
import sys
import textwrap

from shared.errors import ErrorCode, LabelDPError

# (the module that registers subcommands, the packages it needs, the top-level commands it registers)
_COMMANDS = (("labels_party.runtime.cli", ("labels_party",), ("labels", "randomizer")),
             ("features_party.cli", ("features_party",), ("features", "predict", "quantiles")),
             ("labeldp.commands", ("labels_party", "features_party"), ("bench", "demo", "compose-demo")))


# A dash then a digit (or a point and a digit) starts a value, never an option: a negative number, a range with a
# negative bound (--labels -60:180, --clip -5:5) or a list (--labels -1,0,1). argparse reads only plain negative
# numbers as values (its private _negative_number_matcher, the one hook it has) and "-60:180" as an unknown option,
# then fails with "expected one argument". No option of this CLI starts with a dash and a digit.
_STARTS_A_VALUE = re.compile(r"^-\.?\d")


class _Formatter(argparse.HelpFormatter):
    """Wraps help at spaces only, so that a name with a hyphen (laplace-clipped, --test-fraction) stays whole."""

    def _split_lines(self, text, width):
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)

    def _fill_text(self, text, width, indent):
        return textwrap.fill(" ".join(text.split()), width, initial_indent=indent, subsequent_indent=indent,
                             break_on_hyphens=False)


class _Parser(argparse.ArgumentParser):
    """Every (sub)command's parser (subparsers are made with ``parser_class=type(parent)``)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = _STARTS_A_VALUE

    def error(self, message):  # argparse's default prints usage; keep bad input to one line
        raise LabelDPError(message, code=ErrorCode.USAGE)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """Every command's parser; given the ``command`` about to be parsed, only the module that registers it is
    imported — ``labeldp features …`` (its ``serve`` among them) then never imports the labels party's solvers,
    about 2 s of CPU at every start (issue 40: suite time, where the tests start these commands often)."""
    parser = _Parser(prog="labeldp", description="Label differential privacy for two-party training.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    wanted = [entry for entry in _COMMANDS if command in entry[2]] or _COMMANDS
    for module, needs, _names in wanted:
        try:
            for package in needs:
                importlib.import_module(package)
        except ModuleNotFoundError as err:
            if err.name in needs:
                continue  # that party is not in this image
            raise
        importlib.import_module(module).register(commands)
    return parser


@contextlib.contextmanager
def _only_json_on_stdout(enabled: bool):
    """With ``--json``, stdout carries exactly the one JSON document the command prints: what native libraries
    write to file descriptor 1 on their own (HiGHS prints a banner when a solver is made) goes to stderr."""
    if not enabled:
        yield
        return
    sys.stdout.flush()
    original = os.dup(1)
    os.dup2(2, 1)  # native writes to fd 1 now reach stderr
    saved = sys.stdout
    try:
        writes_fd_1 = saved.fileno() == 1
    except (AttributeError, ValueError, io.UnsupportedOperation):
        writes_fd_1 = False  # already redirected in Python (a test's capture): leave it
    if writes_fd_1:
        sys.stdout = os.fdopen(os.dup(original), "w")
    try:
        yield
    finally:
        sys.stdout.flush()
        if writes_fd_1:
            sys.stdout.close()
            sys.stdout = saved
        os.dup2(original, 1)
        os.close(original)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # Everything this tool writes — uploaded labels, releases, databases, keys, Spark's scratch in local mode — is
    # its user's alone: a review found labels files readable by every local user under the usual umask 022.
    os.umask(0o077)
    with _only_json_on_stdout(_asks_for_json(argv)):
        return _run(argv)


def _asks_for_json(argv: list[str]) -> bool:
    """``--json`` or an abbreviation argparse accepts for it (``--js``), decided before parsing so that nothing the
    parsers' imports write reaches stdout either; a stray match (a value spelled --json) costs nothing."""
    return any(len(arg) > 2 and "--json".startswith(arg) for arg in argv)


def _run(argv: list[str]) -> int:
    try:
        args = build_parser(argv[0] if argv else None).parse_args(argv)
        return int(args.handler(args) or 0)
    except LabelDPError as err:
        print(f"labeldp: error: {err}", file=sys.stderr)
        return 2
    except (OSError, KeyboardInterrupt) as err:
        print(f"labeldp: error: {err}", file=sys.stderr)
        return 1
    except Exception as err:
        from pydantic import ValidationError  # here, not at start: `--help` imports no pydantic

        if isinstance(err, ValidationError):  # settings (LABELDP_*) out of their ranges: one line, each field and why
            problems = "; ".join(f"{'.'.join(str(part) for part in e['loc']) or 'settings'}: {e['msg']}"
                                 for e in err.errors())
            print(f"labeldp: error: invalid {err.title}: {problems}", file=sys.stderr)
            return 2
        # a bug: still one line unless debugging
        if os.environ.get("LABELDP_DEBUG"):
            raise
        print(f"labeldp: internal error: {type(err).__name__}: {err} (set LABELDP_DEBUG=1 for a traceback)",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
