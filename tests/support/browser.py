"""A real Chromium for the dashboard's tests: Playwright for Python
driving Debian's ``chromium`` package.

Playwright's own browser downloads are not reachable from where phasegate is
built, so ``playwright install`` is never called: the browser is the one the
system has, given to Playwright as ``executable_path`` — ``PHASEGATE_CHROMIUM``,
else ``/usr/bin/chromium`` (Debian's package; ``.ci/run`` installs it), else
``chromium`` on PATH. Headless; ``--no-sandbox`` when run as root (Chromium
refuses its own sandbox to root).

Fixtures (the test extra: pytest, playwright; a test module or conftest names
this module in ``pytest_plugins``): ``chromium_browser``, one browser for the
session, and ``browser_page``, a page in a fresh context (cookies of its
own: a second ``browser_page`` is a second person), closed after the test.
Where the browser or Playwright is missing they skip, saying what to install,
and fail instead when ``CI`` is set or ``PHASEGATE_BROWSER=required``: CI must
have them.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

__all__ = [
    "CHROMIUM_VARIABLE",
    "DEBIAN_CHROMIUM",
    "BrowserUnavailable",
    "browser_page",
    "chromium",
    "chromium_browser",
    "chromium_path",
    "launch_args",
]

#: The environment variable naming the Chromium executable to drive.
CHROMIUM_VARIABLE = "PHASEGATE_CHROMIUM"

#: Where Debian's ``chromium`` package puts the browser.
DEBIAN_CHROMIUM = "/usr/bin/chromium"


class BrowserUnavailable(Exception):
    """No Chromium, or no Playwright, to drive it with; the message says what to install."""


def chromium_path() -> str | None:
    """The Chromium executable to drive (this module's docstring says which), or None."""
    named = os.environ.get(CHROMIUM_VARIABLE)
    if named:
        return named if Path(named).exists() else None
    if Path(DEBIAN_CHROMIUM).exists():
        return DEBIAN_CHROMIUM
    return shutil.which("chromium")


def launch_args() -> list[str]:
    """Chromium's command-line switches: ``--no-sandbox`` as root, which Chromium's own
    sandbox refuses; ``--disable-dev-shm-usage``: a container's /dev/shm is small."""
    switches = ["--disable-dev-shm-usage"]
    if os.geteuid() == 0:
        switches.append("--no-sandbox")
    return switches


@contextmanager
def chromium(*, headless: bool = True) -> Iterator[Browser]:
    """A launched Chromium (``chromium_path``) under Playwright's sync API, closed at
    the end. Raises BrowserUnavailable when Playwright or the browser is missing."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        raise BrowserUnavailable(
            f"Playwright for Python is not installed ({exc}); pip install -e '.[test]'"
        ) from None
    path = chromium_path()
    if path is None:
        raise BrowserUnavailable(
            f"no Chromium: neither ${CHROMIUM_VARIABLE}, {DEBIAN_CHROMIUM} nor chromium on "
            "PATH (apt-get install chromium; never `playwright install`)"
        )
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=path, headless=headless, args=launch_args()
        )
        try:
            yield browser
        finally:
            browser.close()


def _required() -> bool:
    return bool(os.environ.get("CI")) or os.environ.get("PHASEGATE_BROWSER") == "required"


@pytest.fixture(scope="session")
def chromium_browser() -> Iterator[Browser]:
    """One headless Chromium for the test session (skips without one, fails in CI)."""
    try:
        with chromium() as browser:
            yield browser
    except BrowserUnavailable as exc:
        if _required():
            pytest.fail(f"CI needs a real browser: {exc}")
        pytest.skip(str(exc))


@pytest.fixture
def browser_page(chromium_browser: Browser) -> Iterator[Page]:
    """A page in a context of its own (its own cookies), closed after the test."""
    context = chromium_browser.new_context()
    try:
        yield context.new_page()
    finally:
        context.close()
