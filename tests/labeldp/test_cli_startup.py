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
