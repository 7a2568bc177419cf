"""Every Sphinx-style cross-reference in the code's docstrings and comments (``:class:`labels_party.x.Y```,
``:func:``, ``:mod:``, ``:meth:``, ``:data:``, ``:attr:``, ``:exc:``) with a full dotted path names something that
exists: a class renamed or a function moved leaves no docstring pointing at nothing (issue 42: docstrings cited
``transaction.Priced`` after it moved to ``lifecycle``)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("shared", "labels_party", "features_party", "labeldp")
REFERENCE = re.compile(r":(?:class|func|meth|mod|data|attr|exc):`~?((?:shared|labels_party|features_party|labeldp)"
                       r"\.[A-Za-z0-9_.]+)`")


def _resolves(target: str) -> bool:
    parts = target.rstrip(".").split(".")
    for cut in range(len(parts), 0, -1):  # the longest importable prefix, then attributes
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for name in parts[cut:]:
                found = getattr(found, name)
        except AttributeError:
            return False
        return True
    return False


def test_every_dotted_reference_names_something_that_exists():
    references = [(path.relative_to(ROOT), match.group(1)) for package in PACKAGES
                  for path in sorted((ROOT / package).rglob("*.py"))
                  for match in REFERENCE.finditer(path.read_text())]
    assert len(references) > 100  # the scan sees the code base
    unresolved = [f"{path}: {target}" for path, target in references if not _resolves(target)]
    assert not unresolved, unresolved
