"""git over HTTPS to a GitLab project, with the forge's token written nowhere.

The remote is the project's ``http_url_to_repo`` as GitLab's API gives it,
named on the command line: no remote is added to the person's configuration.
The token reaches git only through a ``GIT_ASKPASS`` helper that prints the
user ``oauth2`` and then the value of ``ASKPASS_VARIABLE``, a variable set for
that one git process — never in argv, a URL, git config, a log or a prompt.
GitLab takes any user name with a personal, project or group access token as
the password; ``oauth2`` is the one its documentation uses.
``credential.helper`` is emptied so that no helper of the person's offers
another credential or stores this one.

Errors: a failed push or fetch is a ``ForgeError`` carrying git's stderr,
redacted; ``ForgeUnavailable`` when git could not reach GitLab or it answered
5xx, ``ForgeAuthError`` when it refused the token, ``ForgeNotFound`` when the
branch fetched is not there.
"""

from __future__ import annotations

import ipaddress
import re
import stat
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

from phasegate.core.redaction import redact
from phasegate.forge.base import ForgeAuthError, ForgeError, ForgeNotFound, ForgeUnavailable
from phasegate.forge.retries import ForgeRetry, report
from phasegate.git.command import run_git

__all__ = ["ASKPASS_USER", "ASKPASS_VARIABLE", "FETCHED_PREFIX", "GitLabRemote"]

#: The variable the askpass helper reads the token from, set for one git process.
ASKPASS_VARIABLE = "PHASEGATE_FORGE_ASKPASS"
#: The user name sent with the token.
ASKPASS_USER = "oauth2"
#: Where a fetched branch is kept: its own namespace, so a fetch never moves the
#: person's branches or another remote's tracking refs (GitHub's forge uses it too).
FETCHED_PREFIX = "refs/phasegate/forge/"

_ASKPASS_SCRIPT = f"""#!/bin/sh
# phasegate's askpass: git asks for a user name, then a password.
case "$1" in
  Username*) printf '%s\\n' '{ASKPASS_USER}' ;;
  *) printf '%s\\n' "${ASKPASS_VARIABLE}" ;;
esac
"""

# No credential helper, no redirect to another host with the token, and a bound on
# a stalled transfer (git has no overall timeout: < 1 KB/s for 60 s ends it).
_FORGE_GIT = (
    "-c", "credential.helper=", "-c", "http.followRedirects=false",
    "-c", "http.lowSpeedLimit=1000", "-c", "http.lowSpeedTime=60",
)  # fmt: skip

_UNREACHABLE = re.compile(
    r"Could not resolve host|Failed to connect|Connection refused|Connection reset"
    r"|timed out|Operation too slow|The requested URL returned error: 5\d\d"
    r"|HTTP 5\d\d|RPC failed|unexpected disconnect|early EOF|transfer closed",
    re.IGNORECASE,
)
_MISSING = re.compile(r"couldn't find remote ref", re.IGNORECASE)
_HTTP_STATUS = re.compile(r"(?:returned error:|HTTP) (\d{3})")
_REFUSED = re.compile(
    r"Authentication failed|HTTP Basic: Access denied|The requested URL returned error: 40[13]"
    r"|could not read (?:Username|Password)|not allowed to push|HTTP 40[13]",
    re.IGNORECASE,
)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_clone_url(url: str) -> str:
    """``url`` if git may send a token to it: https, or http to this machine only
    (the test server). Raises ForgeError otherwise."""
    parts = urlsplit(url)
    if parts.username or parts.password:
        raise ForgeError("the project's http_url_to_repo holds credentials; phasegate won't use it")
    if parts.scheme == "https" and parts.hostname:
        return url
    if parts.scheme == "http" and parts.hostname and _is_loopback(parts.hostname):
        return url
    raise ForgeError(f"the project's clone URL {url!r} is not https: git will not send the token")


@contextmanager
def _askpass() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="phasegate-askpass-") as folder:
        path = Path(folder) / "askpass"
        path.write_text(_ASKPASS_SCRIPT)
        path.chmod(stat.S_IRWXU)
        yield str(path)


class GitLabRemote:
    """Push to and fetch from the GitLab project at ``url`` (its http_url_to_repo)
    from the local repository ``repo`` with ``token`` (named ``credentials`` in
    errors; ``secrets`` redacted from every message). A push or fetch that could
    not reach GitLab is run ``retries`` times more, ``backoff_s`` apart (doubled
    each time), each wait reported (``phasegate.forge.retries.report``)."""

    def __init__(
        self,
        repo: Path,
        url: str,
        token: str,
        *,
        credentials: str,
        secrets: Sequence[str] = (),
        retries: int = 0,
        backoff_s: float = 0.5,
    ) -> None:
        self.repo = repo
        self.url = check_clone_url(url)
        self.token = token
        self.credentials = credentials
        self.secrets = list(secrets)
        self.retries = retries
        self.backoff_s = backoff_s

    def push(self, branch: str) -> None:
        """Push ``refs/heads/<branch>`` to the same branch, forced: phasegate owns its
        branches, and a rebuilt one must replace what was there."""
        ref = f"refs/heads/{branch}"
        self._run(["push", "--porcelain", "--no-verify", self.url, f"+{ref}:{ref}"], "push")

    def fetch(self, branch: str) -> str:
        """Fetch GitLab's ``branch`` into ``refs/phasegate/forge/<branch>``; its SHA.
        Raises ForgeNotFound when GitLab has no such branch."""
        local = f"{FETCHED_PREFIX}{branch}"
        refspec = f"+refs/heads/{branch}:{local}"
        self._run(["fetch", "--no-tags", "--no-write-fetch-head", self.url, refspec], "fetch")
        proc = run_git(["rev-parse", "--verify", "--quiet", f"{local}^{{commit}}"], self.repo)
        if proc.returncode != 0:
            raise ForgeError(f"git fetch of {branch} from {self.url} left no {local}")
        return proc.stdout.strip()

    def has_commit(self, sha: str) -> bool:
        proc = run_git(["cat-file", "-e", f"{sha}^{{commit}}"], self.repo)
        return proc.returncode == 0

    def _run(self, args: list[str], what: str) -> None:
        for attempt in range(self.retries + 1):
            try:
                self._run_once(args, what)
                return
            except ForgeUnavailable as exc:
                if attempt == self.retries:
                    raise
                said = _HTTP_STATUS.search(str(exc))
                status: int | str = int(said.group(1)) if said else "unreachable"
            wait = min(self.backoff_s * 2**attempt, 8.0)
            report(ForgeRetry(f"git {what}", status, wait, attempt + 2, "transient"))
            time.sleep(wait)

    def _run_once(self, args: list[str], what: str) -> None:
        with _askpass() as helper:
            env = {"GIT_ASKPASS": helper, ASKPASS_VARIABLE: self.token, "GIT_TERMINAL_PROMPT": "0"}
            proc = run_git([*_FORGE_GIT, *args], self.repo, env=env)
        if proc.returncode == 0:
            return
        stderr = redact(proc.stderr.strip(), [self.token, *self.secrets])
        message = f"git {what} to {self.url} failed: {stderr}"
        if _MISSING.search(stderr):
            raise ForgeNotFound(message)
        if _REFUSED.search(stderr):
            raise ForgeAuthError(f"{message} (GitLab refused {self.credentials})")
        if _UNREACHABLE.search(stderr):
            raise ForgeUnavailable(message)
        raise ForgeError(message)
