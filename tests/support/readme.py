"""The README's runnable blocks, which tests execute as written: each sits between ``<!-- NAME:begin -->`` and
``<!-- NAME:end -->`` markers as one fenced block."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_block(name: str, language: str) -> str:
    """The code of the README's fenced ``language`` block marked ``name``."""
    pattern = rf"<!-- {re.escape(name)}:begin -->\n```{language}\n(.*?)```\n<!-- {re.escape(name)}:end -->"
    block = re.search(pattern, README.read_text(), re.S)
    assert block, f"README lost its {name} block"
    return block.group(1)
