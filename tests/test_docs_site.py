"""The documentation site (issue 42): the README stays short and its links resolve; the reference pages generated
from the code are what is committed (regenerating yields no diff); the site builds offline with no warning (MkDocs
strict: every internal link and anchor resolves). The tutorials' runnable blocks run in tests/test_readme_sdk.py and
tests/test_readme_own_data.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from labeldp import docs_reference
from tests.support.readme import DOCS, README, ROOT


def test_the_readme_is_short_and_its_links_resolve():
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    links = re.findall(r"\]\(([^)]+)\)", text)
    local = [link for link in links if not link.startswith(("http://", "https://"))]
    assert len(local) >= 20  # the tutorials, how-tos, reference and explanation it points to
    assert [link for link in local if not (ROOT / link).is_file()] == []


def test_regenerating_the_reference_yields_no_diff(tmp_path):
    for path in docs_reference.write(tmp_path):
        committed = DOCS / "reference" / path.name
        assert path.read_text() == committed.read_text(), f"{committed} is stale: run make docs"


def test_the_site_builds_offline_with_no_warning(tmp_path):
    done = subprocess.run([str(Path(sys.executable).parent / "mkdocs"), "build", "--strict", "--site-dir",
                           str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "WARNING" not in done.stderr, done.stderr[-3000:]
    api = (tmp_path / "site" / "reference" / "python-api" / "index.html").read_text()
    assert "upload_frame" in api and "estimate_test_mse" in api  # generated from the clients' docstrings
    assert (tmp_path / "site" / "tutorials" / "python-sdk" / "index.html").is_file()
