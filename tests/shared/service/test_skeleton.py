"""The one error envelope of both services: every error code raised anywhere in the code base is an
:class:`ErrorCode` member (so it has one HTTP status, and the OpenAPI documents it), and every member is used."""

from __future__ import annotations

import ast
from pathlib import Path

from shared.errors import ErrorCode, status_of

ROOT = Path(__file__).resolve().parents[3]  # the repository (this file is tests/shared/service/test_skeleton.py)
PACKAGES = ("shared", "labels_party", "features_party", "labeldp")


def _literals(value) -> list[ast.Constant]:
    """The string literals a value can be: a literal, or either branch of ``"a" if ... else "b"``."""
    if isinstance(value, ast.Constant) and isinstance(value.value, str):
        return [value]
    if isinstance(value, ast.IfExp):
        return _literals(value.body) + _literals(value.orelse)
    return []


def _codes_in_source() -> dict[str, list[str]]:
    """Error codes written in the source: ``code="..."`` keywords, ``code = "..."`` class attributes of error
    classes and ``ErrorCode.NAME`` references; code -> where."""
    found: dict[str, list[str]] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in ast.walk(tree):
                value = None
                if isinstance(node, ast.keyword) and node.arg == "code":
                    value = node.value
                elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "code"
                                                          for t in node.targets):
                    value = node.value
                elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                      and node.value.id == "ErrorCode" and node.attr.isupper()):
                    found.setdefault(ErrorCode[node.attr].value, []).append(f"{path.relative_to(ROOT)}")
                for constant in _literals(value):
                    found.setdefault(constant.value, []).append(f"{path.relative_to(ROOT)}:{constant.lineno}")
    return found


def test_every_raise_site_names_a_member_not_a_string():
    literal = {code: [where for where in places if ":" in where] for code, places in _codes_in_source().items()}
    literal = {code: where for code, where in literal.items() if where}
    assert not literal, f"error codes written as strings (write ErrorCode.NAME): {literal}"


def test_every_raised_code_is_declared_with_its_status():
    found = _codes_in_source()
    undeclared = {code: where for code, where in found.items() if code not in ErrorCode._value2member_map_}
    assert not undeclared, f"error codes missing from ErrorCode: {undeclared}"
    assert len(found) >= 40  # the scan sees the code base (a broken scan would find nothing and pass)


def test_every_declared_code_is_used():
    unused = set(ErrorCode._value2member_map_) - set(_codes_in_source())
    assert not unused, f"ErrorCode members nothing raises: {sorted(unused)}"


def test_statuses():
    assert status_of("budget_exceeded") == 409 and status_of("unauthorized") == 401
    assert status_of("invalid_request") == 422 and status_of("solver_timeout") == 503
    assert all(400 <= member.status < 600 for member in ErrorCode)
