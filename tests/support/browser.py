"""Debian's chromium driven by Playwright (``make test``'s target ``browser`` installs it; Playwright never downloads a
browser), for the tests that look at a page as a person would."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator

import pytest


@contextlib.contextmanager
def chromium() -> Iterator:
    """A headless chromium (a Playwright ``Browser``), closed on exit; the test fails if chromium is missing."""
    executable = shutil.which("chromium")
    if executable is None:
        pytest.fail("chromium is not installed: `make test` (target `browser`) installs Debian's package")
    from playwright.sync_api import sync_playwright

    # Chromium will not run as root with its sandbox (CI runs as root); the pages are our own, on loopback.
    arguments = ["--no-sandbox"] if os.geteuid() == 0 else []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=arguments)
        try:
            yield browser
        finally:
            browser.close()
