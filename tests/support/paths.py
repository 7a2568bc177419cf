"""Error messages never say where a service keeps its files (issue 26)."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

# An absolute path: a '/' at the start, after a blank or a quote, then a name and another '/'.
ABSOLUTE_PATH = re.compile(r"(^|\s|')/[\w.-]+/")


def assert_path_free(message: str, *directories: str | Path) -> None:
    """No absolute path, no temporary directory, none of ``directories`` (as given or resolved)."""
    assert ABSOLUTE_PATH.search(message) is None, message
    assert "/tmp" not in message and tempfile.gettempdir() not in message, message
    for directory in directories:
        for form in {str(directory), str(Path(directory).resolve())}:
            assert form not in message, message
