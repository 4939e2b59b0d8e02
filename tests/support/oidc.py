"""A real OpenID Connect provider for the sign-on tests: node-oidc-provider
(npm ``oidc-provider`` 9.x) run by ``oidc_provider.mjs`` beside this module.

The package is found at ``PHASEGATE_OIDC_PROVIDER`` (its directory), else where
``.ci/run`` installs it (``.ci/node/node_modules/oidc-provider``); node on PATH.
``OidcProvider`` starts it on a free port of 127.0.0.1 with one client
(``CLIENT_ID``/``CLIENT_SECRET``) allowed to come back to ``redirect_uris``, and
the people of ``PEOPLE`` (login: any password). Missing node or the package,
``find_provider`` raises ``ProviderUnavailable`` saying what to install;
``provider_required`` says whether a test must then fail rather than skip (CI,
``PHASEGATE_BROWSER=required``, or ``PHASEGATE_OIDC_PROVIDER`` set).

``sign_in_over_http`` walks the provider's login and consent pages with httpx,
as a browser would, for the tests that need no browser.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urljoin

import httpx

__all__ = [
    "CLIENT_ID",
    "CLIENT_SECRET",
    "PEOPLE",
    "OidcProvider",
    "ProviderUnavailable",
    "find_provider",
    "provider_required",
    "sign_in_over_http",
]

CLIENT_ID = "phasegate-dashboard"
CLIENT_SECRET = "client-secret-for-tests-0123456789"
#: Each person the provider knows, and their ``groups`` claim (oidc_provider.mjs).
PEOPLE = {
    "alice": ["phasegate-approvers", "staff"],
    "vera": ["staff"],
    "ada": ["phasegate-admins"],
    "otto": ["contractors"],
}
_SCRIPT = Path(__file__).with_name("oidc_provider.mjs")
_ROOT = Path(__file__).resolve().parents[2]
_INSTALLED = _ROOT / ".ci" / "node" / "node_modules" / "oidc-provider"
#: Seconds node may take to start and answer.
START_S = 30.0


class ProviderUnavailable(Exception):
    """No node, or no oidc-provider package; the message says what to install."""


def provider_required() -> bool:
    """Whether a missing provider fails a test instead of skipping it."""
    return (
        bool(os.environ.get("CI"))
        or os.environ.get("PHASEGATE_BROWSER") == "required"
        or bool(os.environ.get("PHASEGATE_OIDC_PROVIDER"))
    )


def find_provider() -> tuple[str, Path]:
    """node's path and the oidc-provider package's directory. Raises ProviderUnavailable."""
    node = shutil.which("node")
    if node is None:
        raise ProviderUnavailable("no node on PATH (apt-get install nodejs npm)")
    named = os.environ.get("PHASEGATE_OIDC_PROVIDER")
    package = Path(named) if named else _INSTALLED
    if not (package / "lib" / "index.js").is_file():
        raise ProviderUnavailable(
            f"no oidc-provider at {package}: bash .ci/run installs it "
            "(npm install --prefix .ci/node oidc-provider@9), or set PHASEGATE_OIDC_PROVIDER "
            "to the package's directory"
        )
    return node, package


@dataclass
class OidcProvider:
    """node-oidc-provider on ``port`` of 127.0.0.1 (0: a free one), naming itself
    ``http://HOST:PORT`` (``host`` "localhost" makes it another site than a
    dashboard on 127.0.0.1, as a real provider is), with a signing key of its own
    each start. ``issuer`` is set once it answers; use it as a context manager."""

    redirect_uris: list[str]
    host: str = "localhost"
    port: int = 0  # 0: a free one
    issuer: str = ""
    output: list[str] = field(default_factory=list)

    def __enter__(self) -> OidcProvider:
        node, package = find_provider()
        env = {
            **os.environ,
            "OIDC_PROVIDER_DIR": str(package),
            "OIDC_HOST": self.host,
            "OIDC_PORT": str(self.port),
            "OIDC_CLIENT_ID": CLIENT_ID,
            "OIDC_CLIENT_SECRET": CLIENT_SECRET,
            "OIDC_REDIRECT_URIS": json.dumps(self.redirect_uris),
            "NO_COLOR": "1",
        }
        self._process = subprocess.Popen(
            [node, str(_SCRIPT)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            env=env, start_new_session=True, text=True,
        )  # fmt: skip
        started = threading.Event()
        self._reader = threading.Thread(target=self._read, args=(started,), daemon=True)
        self._reader.start()
        if not started.wait(START_S) or not self.issuer:
            self.__exit__()
            raise RuntimeError("the OIDC provider did not start:\n" + "\n".join(self.output))
        return self

    def _read(self, started: threading.Event) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            self.output.append(line.rstrip())
            if not self.issuer and line.startswith('{"issuer"'):
                self.issuer = json.loads(line)["issuer"]
                started.set()
        started.set()  # it ended: __enter__ stops waiting

    def __exit__(self, *exc_info: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._process.pid, signal.SIGTERM)
        try:
            self._process.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, signal.SIGKILL)
            self._process.wait()
        self._reader.join(10)
        if self._process.stdout is not None:
            self._process.stdout.close()


_FORM_ACTION = re.compile(r'<form[^>]*action="([^"]+)"')
_ABORT_LINK = re.compile(r'href="([^"]*/abort)"')


def sign_in_over_http(
    client: httpx.Client, authorize_url: str, login: str, *, cancel: bool = False
) -> str:
    """Follow ``authorize_url`` (the provider's authorization request) through the
    login page (as ``login``; ``cancel``: its cancel link instead) and the consent
    page, as a browser would with ``client``'s cookies; returns the URL the provider
    sends the person back to (the dashboard's callback with ``code`` and ``state``,
    or an ``error``)."""
    provider = authorize_url.split("/auth?")[0]
    url = authorize_url
    for _step in range(12):
        answer = client.get(url)
        if answer.is_redirect:
            url = urljoin(url, answer.headers["location"])
            if not url.startswith(provider):
                return url  # back to the dashboard
            continue
        abort = _ABORT_LINK.search(answer.text)
        if cancel and abort:
            url = urljoin(url, abort.group(1))
            continue
        action = _FORM_ACTION.search(answer.text)
        assert action, f"no form on the provider's page {url}:\n{answer.text[:2000]}"
        target = urljoin(url, action.group(1))
        if 'name="login"' in answer.text:
            form = {"prompt": "login", "login": login, "password": "any"}
        else:
            form = {"prompt": "consent"}
        posted = client.post(target, data=form)
        assert posted.is_redirect, f"{target} answered {posted.status_code}: {posted.text[:2000]}"
        url = urljoin(target, posted.headers["location"])
        if not url.startswith(provider):
            return url
    raise AssertionError(f"the provider never sent the person back (last at {url})")
