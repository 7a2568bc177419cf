"""The runnable blocks of the README and the documentation site's pages, which tests execute as written: each sits
between ``<!-- NAME:begin -->`` and ``<!-- NAME:end -->`` markers as one fenced block."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"


def readme_block(name: str, language: str, page: Path = README) -> str:
    """The code of ``page``'s fenced ``language`` block marked ``name`` (the README's by default)."""
    pattern = rf"<!-- {re.escape(name)}:begin -->\n```{language}\n(.*?)```\n<!-- {re.escape(name)}:end -->"
    block = re.search(pattern, page.read_text(), re.S)
    assert block, f"{page.name} lost its {name} block"
    return block.group(1)
