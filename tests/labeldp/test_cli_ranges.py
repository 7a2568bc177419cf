"""Every option that takes a range (LOW:HIGH) accepts a negative lower bound both as ``--opt -60:180`` and as
``--opt=-60:180`` (argparse alone reads "-60:180" as an unknown option: "expected one argument")."""

from __future__ import annotations

import pytest

from labeldp.cli import main
from tests.support.cli_parsers import commands

RANGE = "LOW:HIGH"


def _range_options() -> list[tuple[tuple[str, ...], str, object]]:
    """(command path, option, parser) of every option whose metavar or help says it takes LOW:HIGH."""
    found = []
    for path, parser in commands():
        for action in parser._actions:
            if action.option_strings and RANGE in f"{action.metavar or ''} {action.help or ''}":
                found.append((path, action.option_strings[0], parser))
    return found


def test_the_range_options_are_found():
    assert {(" ".join(path), option) for path, option, _ in _range_options()} == {
        ("randomizer solve", "--labels"), ("randomizer audit", "--labels"), ("bench utility", "--clip")}


def _required(parser, skip: str) -> list[str]:
    """The smallest values for the parser's other required options (the first choice, else 1)."""
    argv = []
    for action in parser._actions:
        if action.required and action.option_strings and skip not in action.option_strings:
            argv += [action.option_strings[0], str(action.choices[0]) if action.choices else "1"]
    return argv


@pytest.mark.parametrize(("path", "option", "parser"), _range_options(),
                         ids=lambda v: "-".join(v) if isinstance(v, tuple) else v if isinstance(v, str) else "")
@pytest.mark.parametrize("spelling", ["separate", "equals"])
def test_a_negative_lower_bound_parses(path, option, parser, spelling):
    for value in ("-60:180", "-0.5:2.5", "-5:5:0.5"):
        given = [option, value] if spelling == "separate" else [f"{option}={value}"]
        args = parser.parse_args([*given, *_required(parser, option)])
        assert getattr(args, parser._option_string_actions[option].dest) == value


def test_negative_bounds_reach_the_command(capsys):
    assert main(["randomizer", "solve", "--mechanism", "laplace", "--epsilon", "1", "--labels", "-60:180",
                 "--json"]) == 0
    assert '"num_labels": 241' in capsys.readouterr().out
    # a dash and a letter is still an option: the missing value is named
    assert main(["randomizer", "solve", "--mechanism", "laplace", "--epsilon", "1", "--labels", "--json"]) == 2
    assert "--labels: expected one argument" in capsys.readouterr().err
