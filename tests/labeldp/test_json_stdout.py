"""Every ``labeldp`` command that takes ``--json``, run as a process: stdout is exactly one JSON document (what
``| jq`` and scripts need) — no library banner, no log line. The commands are found by walking the parsers, so a
new one fails here until it is given arguments below."""

from __future__ import annotations

import atexit
import contextlib
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.features_party.test_quantiles_cli import labels_party
from tests.labeldp.test_bench_plan import flights
from tests.support.cli_parsers import commands, takes


def _labeldp(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "labeldp", *args], capture_output=True, text=True, timeout=300)


def _storage(party: str, tmp: Path) -> list[str]:
    return ["--database-url", f"sqlite:///{tmp}/{party}.db", "--data-dir", str(tmp / party)]


def _a_key(party: str, tmp: Path) -> list[str]:
    """A key to revoke or rotate: made first, by the command that makes keys."""
    made = _labeldp(party, "create-key", "--org", "o", "--role", "admin", *_storage(party, tmp), "--json")
    assert made.returncode == 0, made.stderr
    return ["--id", str(json.loads(made.stdout)["id"])]


def _table(tmp: Path) -> str:
    path = tmp / "flights.csv"
    flights().to_csv(path, index=False)
    return str(path)


_SERVERS = contextlib.ExitStack()  # labels parties the commands talk to, stopped when the session ends
atexit.register(_SERVERS.close)


def _imported(tmp: Path) -> list[str]:
    """A table of Parquet files for ``features import-features``, its organization made first (a key)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    _a_key("features", tmp)  # organization "o"
    pq.write_table(pa.table({"example_id": ["a", "b"], "x": [1.0, 2.0]}), tmp / "table.parquet")
    return ["--org", "o", "--name", "t", str(tmp / "table.parquet"), *_storage("features", tmp)]


def _quantiles(tmp: Path) -> list[str]:
    party = labels_party(tmp, _SERVERS)
    return ["--url", party["url"], "--key", party["key"], "--dataset", party["dataset"], "--quantiles", "0.5",
            "--epsilon", "0.5"]


def _key_commands(party: str) -> dict[tuple[str, ...], Callable[[Path], list[str]]]:
    return {(party, "create-key"): lambda tmp: ["--org", "o", "--role", "admin", *_storage(party, tmp)],
            (party, "list-keys"): lambda tmp: _storage(party, tmp),
            (party, "revoke-key"): lambda tmp: [*_a_key(party, tmp), *_storage(party, tmp)],
            (party, "rotate-key"): lambda tmp: [*_a_key(party, tmp), *_storage(party, tmp)]}


# The smallest valid arguments of each command (after its path), given a fresh temporary directory.
ARGUMENTS: dict[tuple[str, ...], Callable[[Path], list[str]]] = {
    **_key_commands("labels"), **_key_commands("features"),
    ("labels", "audit-key"): lambda tmp: ["--key-file", str(tmp / "audit.key")],
    # the mesh LP makes a HiGHS solver, whose library prints a banner on stdout unless told not to
    ("randomizer", "solve"): lambda tmp: ["--mechanism", "opt-unbiased", "--solver", "mesh", "--epsilon", "1",
                                          "--labels", "-2:2"],
    ("randomizer", "audit"): lambda tmp: ["--mechanism", "rr", "--epsilon", "1", "--labels", "0:2",
                                          "--samples", "100", "--seed", "0"],
    ("quantiles",): _quantiles,
    ("features", "import-features"): _imported,
    ("bench", "utility"): lambda tmp: ["--dry-run", "--data", _table(tmp), "--label", "delay", "--seeds", "1",
                                       "--epsilons", "1", "--mechanisms", "laplace"],
}
JSON_COMMANDS = sorted(path for path, parser in commands() if takes(parser, "--json"))


def test_every_json_command_has_arguments_here():
    assert JSON_COMMANDS == sorted(ARGUMENTS), "give each command that takes --json its arguments in ARGUMENTS"


@pytest.mark.parametrize("path", JSON_COMMANDS, ids=" ".join)
def test_stdout_is_exactly_one_json_document(path, tmp_path):
    if path not in ARGUMENTS:
        pytest.fail(f"labeldp {' '.join(path)} takes --json: add its arguments to ARGUMENTS")
    done = _labeldp(*path, *ARGUMENTS[path](tmp_path), "--json")
    assert done.returncode == 0, done.stderr
    document, end = json.JSONDecoder().raw_decode(done.stdout)  # one document, then only its newline
    assert isinstance(document, dict) and document
    assert done.stdout[end:] == "\n", done.stdout[end:]


def test_highs_is_silent_from_its_construction():
    """highspy's Highs() writes its banner to file descriptor 1 when it is made (the control, which tells when a
    new highspy stops doing so); the solvers' factory turns the output off before that."""
    def stdout_of(code: str) -> str:
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout

    assert "Running HiGHS" in stdout_of("import highspy; highspy.Highs()")
    quiet = stdout_of("import highspy\nfrom labels_party.core.solvers.highs_lp import quiet_highs\n"
                      "h = quiet_highs()\nassert isinstance(h, highspy.Highs)\nprint(h.getOptionValue('output_flag'))")
    assert "HiGHS" not in quiet and "False" in quiet


def test_json_mode_sends_native_writes_to_stderr():
    """What a C library writes to file descriptor 1 under --json reaches stderr; Python's print stays on stdout."""
    code = ("import os\nfrom labeldp.cli import _only_json_on_stdout\nwith _only_json_on_stdout(True):\n"
            "    os.write(1, b'native banner\\n')\n    print('{}')\nprint('after')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout == "{}\nafter\n" and done.stderr == "native banner\n"
