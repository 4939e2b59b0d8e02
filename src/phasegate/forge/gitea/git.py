"""git over HTTPS to a Gitea repository, with the forge's token written nowhere.

The remote is ``{instance}/{owner}/{name}.git`` (built from ``forge.base_url``,
not from the API's ``clone_url``: that one is the instance's ROOT_URL, which a
proxy in front of Gitea may not match), named on the command line: no remote
is added to the person's configuration. The token reaches git only through a
``GIT_ASKPASS`` helper — a script that prints the user ``phasegate`` (Gitea
takes a token as the password whatever the user name) and then the value of
``ASKPASS_VARIABLE``, a variable set for that one git process
(``phasegate.git.command.run_git(env=...)``) — never in argv, a URL, git config, a
log or a prompt. ``credential.helper`` is emptied for these calls so that no
helper of the person's offers another credential or stores this one.

Errors: a failed push or fetch is a ``ForgeError`` carrying git's stderr,
redacted; ``ForgeUnavailable`` when git could not reach the server or it
answered 5xx, ``ForgeAuthError`` when it refused the token, ``ForgeNotFound``
when the branch fetched is not there.
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

__all__ = ["ASKPASS_USER", "ASKPASS_VARIABLE", "FETCHED_PREFIX", "GitRemote"]

#: The variable the askpass helper reads the token from. It is passed to one git
#: process explicitly (``_git_env`` withholds secret-named variables and secret
#: values from every other git).
ASKPASS_VARIABLE = "PHASEGATE_FORGE_ASKPASS"
#: The user name sent with the token as the password (Gitea and Forgejo read the
#: token alone).
ASKPASS_USER = "phasegate"
#: Where a fetched base branch is kept: its own namespace, so a fetch never moves
#: the person's branches or another remote's tracking refs.
FETCHED_PREFIX = "refs/phasegate/forge/"

_ASKPASS_SCRIPT = f"""#!/bin/sh
# phasegate's askpass: git asks for a user name, then a password.
case "$1" in
  Username*) printf '%s\\n' '{ASKPASS_USER}' ;;
  *) printf '%s\\n' "${ASKPASS_VARIABLE}" ;;
esac
"""

#: What every forge git call passes: no credential helper (none offers or stores
#: a credential), no automatic redirect to another host with the token, and a
#: bound on a stalled transfer (git has no overall timeout: < 1 KB/s for 60 s ends it).
_FORGE_GIT = (
    "-c",
    "credential.helper=",
    "-c",
    "http.followRedirects=false",
    "-c",
    "http.lowSpeedLimit=1000",
    "-c",
    "http.lowSpeedTime=60",
)

_UNREACHABLE = re.compile(
    r"Could not resolve host|Failed to connect|Connection refused|Connection reset"
    r"|timed out|Operation too slow|The requested URL returned error: 5\d\d"
    r"|HTTP 5\d\d|RPC failed|unexpected disconnect|early EOF|transfer closed",
    re.IGNORECASE,
)
_MISSING = re.compile(r"couldn't find remote ref", re.IGNORECASE)
# The status git names when Gitea answered one, for the retry's log line and event.
_HTTP_STATUS = re.compile(r"(?:returned error:|HTTP) (\d{3})")
_REFUSED = re.compile(
    r"Authentication failed|The requested URL returned error: 40[13]"
    r"|could not read (?:Username|Password)|Permission to .* denied|HTTP 40[13]",
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
    (the test server). Raises ForgeError otherwise: a token over plain http to
    another host would travel in the clear, and any other scheme is no Gitea."""
    parts = urlsplit(url)
    if parts.username or parts.password:
        raise ForgeError("forge.base_url holds credentials; phasegate will not send them to git")
    if parts.scheme == "https" and parts.hostname:
        return url
    if parts.scheme == "http" and parts.hostname and _is_loopback(parts.hostname):
        return url
    raise ForgeError(
        f"the repository's git URL {url!r} is not https: git will not send the token "
        "(set forge.base_url to the instance's https URL)"
    )


@contextmanager
def _askpass() -> Iterator[str]:
    """The path of a fresh askpass script in a private directory, removed after."""
    with tempfile.TemporaryDirectory(prefix="phasegate-askpass-") as folder:
        path = Path(folder) / "askpass"
        path.write_text(_ASKPASS_SCRIPT)
        path.chmod(stat.S_IRWXU)
        yield str(path)


class GitRemote:
    """Push to and fetch from the Gitea repository at ``url`` from
    the local repository ``repo``.

    ``token`` is the token to send. ``credentials`` names it in errors
    (``the token in GITHUB_TOKEN``); ``secrets`` are redacted from every message.
    A push or fetch that could not reach Gitea is run ``retries`` times more,
    ``backoff_s`` apart (doubled each time): both are idempotent. Each wait is
    reported (``phasegate.forge.retries.report``).
    """

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
        """Push ``refs/heads/<branch>`` to the same branch on Gitea, forced:
        phasegate owns its branches, and a rebuilt one must replace what was there.
        Raises ForgeError (see the module)."""
        ref = f"refs/heads/{branch}"
        self._run(["push", "--porcelain", "--no-verify", self.url, f"+{ref}:{ref}"], "push")

    def fetch(self, branch: str) -> str:
        """Fetch Gitea's ``branch`` into ``refs/phasegate/forge/<branch>``; returns
        the SHA it points to. Raises ForgeNotFound when Gitea has no such branch,
        else ForgeError (see the module)."""
        local = f"{FETCHED_PREFIX}{branch}"
        self._run(
            [
                "fetch",
                "--no-tags",
                "--no-write-fetch-head",
                self.url,
                f"+refs/heads/{branch}:{local}",
            ],
            "fetch",
        )
        proc = run_git(["rev-parse", "--verify", "--quiet", f"{local}^{{commit}}"], self.repo)
        if proc.returncode != 0:
            raise ForgeError(f"git fetch of {branch} from {self.url} left no {local}")
        return proc.stdout.strip()

    def has_commit(self, sha: str) -> bool:
        """Whether the local repository has commit ``sha``."""
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
        token = self.token
        with _askpass() as helper:
            env = {"GIT_ASKPASS": helper, ASKPASS_VARIABLE: token, "GIT_TERMINAL_PROMPT": "0"}
            proc = run_git([*_FORGE_GIT, *args], self.repo, env=env)
        if proc.returncode == 0:
            return
        stderr = redact(proc.stderr.strip(), [token, *self.secrets])
        message = f"git {what} to {self.url} failed: {stderr}"
        if _MISSING.search(stderr):
            raise ForgeNotFound(message)
        if _REFUSED.search(stderr):
            raise ForgeAuthError(f"{message} (Gitea refused {self.credentials})")
        if _UNREACHABLE.search(stderr):
            raise ForgeUnavailable(message)
        raise ForgeError(message)
