"""git over HTTPS to a team forge's repository, with the forge's token written nowhere.

The remote is the repository's URL as the forge gives it (or as its forge builds
it), named on the command line: no remote is added to the person's
configuration. The token reaches git only through a ``GIT_ASKPASS`` helper — a
script that prints the forge's user name (``GitDialect.user``) and then the value
of ``ASKPASS_VARIABLE``, a variable set for that one git process
(``phasegate.git.command.run_git(env=...)``) — never in argv, a URL, git config, a
log or a prompt. ``credential.helper`` is emptied for these calls so that no
helper of the person's offers another credential or stores this one. What differs
between GitHub, GitLab and Gitea is a ``GitDialect``: the user name, what the
URL is called, and what a refusal should tell the person.

Errors: a failed push or fetch is a ``ForgeError`` carrying git's stderr,
redacted; ``ForgeUnavailable`` when git could not reach the server or it
answered 5xx, ``ForgeAuthError`` when it refused the token (or hid the
repository from it), ``ForgeNotFound`` when the branch fetched is not there.
"""

from __future__ import annotations

import re
import stat
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from phasegate.config.forge import is_loopback
from phasegate.core.redaction import redact
from phasegate.forge.base import (
    ForgeAuthError,
    ForgeError,
    ForgeNotFound,
    ForgeUnavailable,
    PullRequest,
)
from phasegate.forge.retries import ForgeRetry, report
from phasegate.git.command import run_git

__all__ = [
    "ASKPASS_VARIABLE",
    "FETCHED_PREFIX",
    "FetchedBranches",
    "GitDialect",
    "GitRemote",
    "check_clone_url",
]

#: The variable the askpass helper reads the token from. It is passed to one git
#: process explicitly (``_git_env`` withholds secret-named variables and secret
#: values from every other git).
ASKPASS_VARIABLE = "PHASEGATE_FORGE_ASKPASS"
#: The variable the askpass helper reads the user name from.
_USER_VARIABLE = "PHASEGATE_FORGE_ASKPASS_USER"
#: Where a fetched base branch is kept: its own namespace, so a fetch never moves
#: the person's branches or another remote's tracking refs.
FETCHED_PREFIX = "refs/phasegate/forge/"

_ASKPASS_SCRIPT = f"""#!/bin/sh
# phasegate's askpass: git asks for a user name, then a password.
case "$1" in
  Username*) printf '%s\\n' "${_USER_VARIABLE}" ;;
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
# The status git names when the forge answered one, for the retry's log line and event.
_HTTP_STATUS = re.compile(r"(?:returned error:|HTTP) (\d{3})")
# What GitHub, GitLab and Gitea tell git when they refuse its token.
_REFUSED = re.compile(
    r"Authentication failed|HTTP Basic: Access denied|The requested URL returned error: 40[13]"
    r"|could not read (?:Username|Password)|Permission to .* denied|not allowed to push"
    r"|HTTP 40[13]",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class GitDialect:
    """What one forge's git over HTTPS says differently.

    ``forge`` names it in messages (``GitHub``); ``user`` is the user name sent
    with the token as the password; ``url_name`` is what its URL is called in an
    error (``the repository's clone_url``); ``url_hint`` is added when that URL is
    refused. ``refused_hint`` is added when the forge refuses the token.
    ``hidden`` is git's answer when the forge hides the repository from the
    token's account instead of refusing it (GitLab's to a Guest), and
    ``hidden_hint`` says what that account needs.
    """

    forge: str
    user: str
    url_name: str
    url_hint: str = ""
    refused_hint: str = ""
    hidden: re.Pattern[str] | None = None
    hidden_hint: str = ""


def check_clone_url(url: str, dialect: GitDialect) -> str:
    """``url`` if git may send a token to it: https, or http to this machine only
    (the test server). Raises ForgeError otherwise: a token over plain http to
    another host would travel in the clear, and any other scheme is no forge's."""
    parts = urlsplit(url)
    if parts.username or parts.password:
        raise ForgeError(f"{dialect.url_name} holds credentials; phasegate will not use it")
    if parts.scheme == "https" and parts.hostname:
        return url
    if parts.scheme == "http" and parts.hostname and is_loopback(parts.hostname):
        return url
    raise ForgeError(
        f"{dialect.url_name} {url!r} is not https: git will not send the token{dialect.url_hint}"
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
    """Push to and fetch from the forge's repository at ``url`` from the local
    repository ``repo``, as ``dialect`` says.

    ``token()`` returns the token to send (called per git command: a GitHub App's
    installation token is renewed by it). ``credentials`` names it in errors
    (``the token in GITHUB_TOKEN``); ``secrets`` are redacted from every message.
    A push or fetch that could not reach the forge is run ``retries`` times more,
    ``backoff_s`` apart (doubled each time): both are idempotent. Each wait is
    reported (``phasegate.forge.retries.report``).
    """

    def __init__(
        self,
        repo: Path,
        url: str,
        token: Callable[[], str],
        *,
        dialect: GitDialect,
        credentials: str,
        secrets: Sequence[str] = (),
        retries: int = 0,
        backoff_s: float = 0.5,
    ) -> None:
        self.repo = repo
        self.dialect = dialect
        self.url = check_clone_url(url, dialect)
        self.token = token
        self.credentials = credentials
        self.secrets = list(secrets)
        self.retries = retries
        self.backoff_s = backoff_s

    def push(self, branch: str) -> None:
        """Push ``refs/heads/<branch>`` to the same branch on the forge, forced:
        phasegate owns its branches, and a rebuilt one must replace what was there.
        Raises ForgeError (see the module)."""
        ref = f"refs/heads/{branch}"
        self._run(["push", "--porcelain", "--no-verify", self.url, f"+{ref}:{ref}"], "push")

    def fetch(self, branch: str) -> str:
        """Fetch the forge's ``branch`` into ``refs/phasegate/forge/<branch>``; returns
        the SHA it points to. Raises ForgeNotFound when the forge has no such branch,
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
        token = self.token()
        with _askpass() as helper:
            env = {
                "GIT_ASKPASS": helper,
                _USER_VARIABLE: self.dialect.user,
                ASKPASS_VARIABLE: token,
                "GIT_TERMINAL_PROMPT": "0",
            }
            proc = run_git([*_FORGE_GIT, *args], self.repo, env=env)
        if proc.returncode == 0:
            return
        stderr = redact(proc.stderr.strip(), [token, *self.secrets])
        message = f"git {what} to {self.url} failed: {stderr}"
        if _MISSING.search(stderr):
            raise ForgeNotFound(message)
        dialect = self.dialect
        if _REFUSED.search(stderr):
            raise ForgeAuthError(
                f"{message} ({dialect.forge} refused {self.credentials}{dialect.refused_hint})"
            )
        if dialect.hidden is not None and dialect.hidden.search(stderr):
            raise ForgeAuthError(
                f"{message} ({dialect.forge} hid the repository's code from "
                f"{self.credentials}, whose API calls it answers{dialect.hidden_hint})"
            )
        if _UNREACHABLE.search(stderr):
            raise ForgeUnavailable(message)
        raise ForgeError(message)


class FetchedBranches:
    """The branches of a team forge as the local repository sees them: fetched
    with the forge's token into ``refs/phasegate/forge/<branch>``, so the person's
    own branches and remote-tracking refs never move. GitHub's, GitLab's and
    Gitea's forges share it; each gives its ``git_remote`` and ``pull_request``."""

    def git_remote(self) -> GitRemote:
        raise NotImplementedError

    def pull_request(self, number: int) -> PullRequest:
        raise NotImplementedError

    def fetch_branch(self, branch: str) -> str | None:
        """Fetch the forge's ``branch`` with the forge's token; its SHA, or None when
        the forge has no such branch. Beyond the Forge protocol: for attaching to a
        branch that survives only on the forge, where a plain ``git fetch origin``
        has no credentials."""
        try:
            return self.git_remote().fetch(branch)
        except ForgeNotFound:
            return None

    def branch_ref(self, branch: str) -> str:
        """Fetch the forge's ``branch`` and return the ref holding it. Raises
        ForgeNotFound when the forge has no such branch, else ForgeError as
        ``GitRemote.fetch`` says."""
        self.git_remote().fetch(branch)
        return f"{FETCHED_PREFIX}{branch}"

    def _fetch_base(self, base: str, sha: str, *, always: bool = False) -> None:
        """Bring ``base`` into the local repository when commit ``sha`` (a merge) is
        not there yet (``always``: in any case): acceptance verification checks it out."""
        remote = self.git_remote()
        if always or not remote.has_commit(sha):
            remote.fetch(base)

    def find_merge(self, number: int) -> str | None:
        """The merge SHA once the forge merged pull request ``number``, its base
        fetched so that the merge commit is local; None before."""
        pr = self.pull_request(number)
        if pr.state != "merged" or not pr.merge_sha:
            return None
        self._fetch_base(pr.base, pr.merge_sha)
        return pr.merge_sha
