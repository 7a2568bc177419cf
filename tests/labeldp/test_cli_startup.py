"""``labeldp`` imports only the module of the command it runs (labeldp/cli.py's ``_COMMANDS``): each module
registers exactly the top-level commands the table says, and a trainer's command does not import the labels
party's solvers (about 2 s of CPU at every start of ``labeldp features …``)."""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys

from labeldp import cli


def test_each_module_registers_the_commands_the_table_names():
    for module, _needs, names in cli._COMMANDS:
        parser = argparse.ArgumentParser()
        commands = parser.add_subparsers(dest="command")
        importlib.import_module(module).register(commands)
        assert tuple(commands.choices) == names, module
    every = cli.build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert set(every) == {name for _, _, names in cli._COMMANDS for name in names}


def test_a_trainer_command_does_not_import_the_labels_party():
    script = ("import sys; from labeldp import cli; parser = cli.build_parser('features'); "
              "parser.parse_args(['features', 'create-key', '--org', 'o', '--role', 'admin']); "
              "print(sorted(m for m in sys.modules if m.startswith('labels_party')))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_help_imports_no_solver_numerics_or_database():
    """Issue 42: `labeldp --help` took 1.7 s idle (6–13 s under load) importing the solvers; it imports none of
    them, nor NumPy, pydantic or SQLAlchemy (0.13 s on this 2-core machine under load). A command's own ``--help``
    still lists its choices (computed when read)."""
    heavy = ("jax", "scipy", "highspy", "dp_accounting", "numpy", "pydantic", "sqlalchemy", "clarabel", "pandas")
    script = ("import sys, runpy\nsys.argv = ['labeldp', '--help']\ntry:\n    runpy.run_module('labeldp', "
              "run_name='__main__')\nexcept SystemExit as done:\n    assert done.code == 0\n"
              f"print(sorted(m for m in {heavy!r} if m in sys.modules), file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1] == "[]", done.stderr[-2000:]
    assert "randomizer" in done.stdout and "labels" in done.stdout
    solve = subprocess.run([sys.executable, "-m", "labeldp", "randomizer", "solve", "--help"], capture_output=True,
                           text=True, timeout=300)
    assert "opt-unbiased, rr-on-bins" in " ".join(solve.stdout.split()), solve.stdout
