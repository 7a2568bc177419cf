"""The ``labeldp`` command: each party contributes its own subcommands; errors become one line on stderr."""

from __future__ import annotations

import argparse
import os
import sys

from shared.errors import LabelDPError


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's default prints usage; keep bad input to one line
        raise LabelDPError(message, code="usage")


def build_parser() -> argparse.ArgumentParser:
    # The composition root imports both parties; nothing else in shared/ does.
    from features_party import cli as features_cli
    from labels_party import cli as labels_cli

    parser = _Parser(prog="labeldp", description="Label differential privacy for two-party training.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    labels_cli.register(commands)
    features_cli.register(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return int(args.handler(args) or 0)
    except LabelDPError as err:
        print(f"labeldp: error: {err}", file=sys.stderr)
        return 2
    except (OSError, KeyboardInterrupt) as err:
        print(f"labeldp: error: {err}", file=sys.stderr)
        return 1
    except Exception as err:  # a bug: still one line unless debugging
        if os.environ.get("LABELDP_DEBUG"):
            raise
        print(f"labeldp: internal error: {type(err).__name__}: {err} (set LABELDP_DEBUG=1 for a traceback)",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
