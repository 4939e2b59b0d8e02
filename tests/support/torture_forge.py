"""What the kill-torture harness needs from a forge's rig, and what every fake forge's rig shares.

A remote forge's trials (GitHub, GitLab, Gitea) differ only in their fake and
what is read on it afterwards; the harness (``support.torture``) asks a rig
for the rest through two protocols:

- ``ForgeRig``: one per run of trials. ``name`` is the trial's mode (``github``
  …), ``forge_for(root)`` starts the trial's fake forge, and
  ``changes_per_run`` is what an uninterrupted run changed there (the later
  kills are spread over what is left of it).
- ``TrialForge``: one trial's started fake. ``seed(repo)`` makes its repository
  from the trial's, ``cartridge()`` is the ``[forge]`` table and ``env`` what
  the worker needs (the bot's token), ``bare`` where the merge lands;
  ``hold_changes()`` holds the next changing request of each method
  (``changing``) ``HOLD_S`` seconds, for the ``<name>_request`` kill to land
  while one is held, and ``release`` forgets the holds no request reached;
  ``answered()`` is every request answered so far; ``check(lab, workflow_id)``
  reads the forge's invariants on the settled trial.

``FakeRig`` is what every rig starts with (``changes_per_run``); ``FakeForge``
implements the request side of ``TrialForge`` over a fake server mixing in
``support.fake_http.Faults`` and recording its ``requests``, and writes the
``[forge]`` table (``forge_table``). The helpers below (``Findings``,
``check_issues``, ``check_twice``, ``check_token``, ``check_merge_line``,
``check_verdict_first``, ``check_status_labels``, ``first_verdict``) are the
invariants every forge reads alike.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
from collections import Counter
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from support.fake_http import Fault
from support.torture_lab import Violation

if TYPE_CHECKING:
    from support.torture_lab import Lab

__all__ = [
    "CHANGING",
    "CHANGES_ONLY",
    "HOLD_S",
    "MARKER",
    "FakeForge",
    "FakeRig",
    "Findings",
    "ForgeRig",
    "TrialForge",
    "bare_git",
    "check_issues",
    "check_merge_line",
    "check_status_labels",
    "check_token",
    "check_twice",
    "check_verdict_first",
    "first_verdict",
    "forge_table",
    "request_aim",
    "utc",
]

#: How long the fake holds the request a ``<name>_request`` kill is aimed at (seconds):
#: the worker is dead before the forge acts, and the forge has acted before a new worker looks.
HOLD_S = 0.3
#: The requests that change a forge (REST, or git over HTTP, whose fetches POST too).
CHANGING = ("POST", "PATCH", "PUT", "DELETE")
#: The paths of the requests that really change a forge: a git fetch POSTs
#: (``git-upload-pack``) and changes nothing, so a hold on it kills nothing in flight.
CHANGES_ONLY = r"^(?!.*/git-upload-pack$)"
#: A hidden comment marker phasegate writes (``<!-- phasegate:... -->``).
MARKER = re.compile(r"<!--\s*(phasegate:[^>]*?)\s*-->")


def request_aim(name: str) -> str:
    """The aim at a request in flight to forge ``name``: ``github_request`` …"""
    return f"{name}_request"


class TrialForge(Protocol):
    """One trial's started fake forge (see the module docstring)."""

    name: str
    changing: tuple[str, ...]

    def seed(self, repo: Path) -> None: ...
    def cartridge(self) -> str: ...
    @property
    def env(self) -> dict[str, str]: ...
    @property
    def bare(self) -> Path: ...
    def changes(self) -> int: ...
    def left(self, per_run: int) -> float: ...
    def hold_changes(self) -> list[Fault]: ...
    def release(self, held: list[Fault]) -> None: ...
    def answered(self) -> list[tuple[str, str]]: ...
    def check(self, lab: Lab, workflow_id: str) -> list[Violation]: ...
    def stop(self) -> None: ...


class ForgeRig(Protocol):
    """A forge's rig for a run of trials (see the module docstring)."""

    name: str
    changes_per_run: int

    def forge_for(self, root: Path) -> TrialForge: ...


class FakeRig:
    """What every fake forge's rig starts a run of trials with."""

    def __init__(self) -> None:
        #: The changing requests an uninterrupted run made (``run_uninterrupted`` sets
        #: it): the trials spread their kill moments over what is left of that.
        self.changes_per_run = 0


def forge_table(kind: str, repository: str, base_url: str) -> str:
    """The cartridge's ``[forge]`` table: ``kind`` at ``base_url``, polled every 0.2 s."""
    return (
        f'[forge]\nkind = "{kind}"\nrepository = "{repository}"\n'
        f'base_url = "{base_url}"\npoll_s = 0.2\n'
    )


class FakeForge:
    """The request side of a ``TrialForge`` on ``server``: a fake forge with
    ``lock``, ``faults`` and ``delay`` (``fake_http.Faults``) and ``requests``
    (each with ``method`` and ``path``), and the ``bot`` phasegate acts as
    there. Subclasses add the rest."""

    name: str = ""
    #: The repository the trial runs on, as the ``[forge]`` table names it.
    repository: str = ""
    #: The variable the worker finds the bot's token in.
    token_env: str = ""
    changing: tuple[str, ...] = CHANGING
    #: Which changing requests a hold may catch (``re.search`` on the path): any.
    held_paths = r"."

    def __init__(self, server: Any, bot: Any) -> None:
        self.server, self.bot = server, bot

    @property
    def base_url(self) -> str:
        """Where phasegate finds the forge: the fake itself."""
        return str(self.server.url)

    def token(self) -> str:
        """The bot's token."""
        raise NotImplementedError

    def cartridge(self) -> str:
        """The ``[forge]`` table: ``repository`` at ``base_url``, polled every 0.2 s."""
        return forge_table(self.name, self.repository, self.base_url)

    @property
    def env(self) -> dict[str, str]:
        """What a phasegate process of the trial needs beyond its environment."""
        return {self.token_env: self.token()}

    def answered(self) -> list[tuple[str, str]]:
        """(method, path) of every request the fake answered so far, in order."""
        with self.server.lock:
            return [(r.method, r.path) for r in self.server.requests]

    def changes(self) -> int:
        """How many changing requests (``changing``) the fake has answered so far."""
        with self.server.lock:
            return sum(1 for r in self.server.requests if r.method in self.changing)

    def left(self, per_run: int) -> float:
        """The share (0..1) of an uninterrupted run's ``per_run`` changing requests
        this trial has not made yet; 1.0 when ``per_run`` is unknown (0)."""
        return max(0.0, 1.0 - self.changes() / per_run) if per_run else 1.0

    def hold_changes(self) -> list[Fault]:
        """Hold the next request of each changing method (whose path ``held_paths``
        matches) ``HOLD_S`` seconds before the fake handles it; the faults, whose
        ``times`` drops to 0 once one is held."""
        return [self.server.delay(method, self.held_paths, HOLD_S) for method in self.changing]

    def release(self, held: list[Fault]) -> None:
        """Forget the holds no request reached (the next kill arms its own)."""
        with self.server.lock:
            for fault in held:
                fault.times = 0
            self.server.faults = [f for f in self.server.faults if f.times > 0]

    def stop(self) -> None:
        self.server.stop()


# -- what every forge's invariants read alike ----------------------------------------------


class Findings(list[Violation]):
    """The violations found on a trial, in the order they were found."""

    def expect(self, ok: bool, kind: str, detail: str) -> None:
        """A ``kind`` violation saying ``detail`` unless ``ok``."""
        if not ok:
            self.append(Violation(kind, detail))


def check_issues(issues: int, ours: int, where: str) -> list[Violation]:
    """[``issues``] Exactly one issue on ``where``, holding the workflow's marker."""
    if issues == 1 and ours == 1:
        return []
    return [Violation("issues", f"{issues} issues on {where}, {ours} with the workflow's marker")]


def check_twice(markers: Counter[Any], what: str) -> list[Violation]:
    """[``duplicate_comment``] No hidden marker counted twice (``what`` names the keys)."""
    twice = {key: n for key, n in markers.items() if n > 1}
    if not twice:
        return []
    return [Violation("duplicate_comment", f"{what} more than once: {twice}")]


def check_verdict_first(
    lab: Lab, workflow_id: str, closed_at: datetime | None, *, to_the_second: bool = False
) -> list[Violation]:
    """[``issue_closed``] The issue, closed at ``closed_at`` (None: not closed), closed
    no earlier than a verifier first answered (``to_the_second``: ``closed_at``'s
    microseconds left out, as ``first_verdict`` leaves them out)."""
    first = first_verdict(lab, workflow_id)
    compared = closed_at.replace(microsecond=0) if closed_at and to_the_second else closed_at
    if closed_at is not None and (first is None or (compared is not None and compared < first)):
        return [Violation("issue_closed", f"closed at {closed_at}; first verdict {first}")]
    return []


def check_status_labels(labels: Iterable[str]) -> list[Violation]:
    """[``labels``] ``phasegate:done`` the issue's only status label."""
    status = sorted(x for x in labels if x.startswith("phasegate:"))
    if status != ["phasegate:done"]:
        return [Violation("labels", f"the issue's status labels: {status}")]
    return []


def check_token(
    lab: Lab, token: str, bare: Path, sent: Iterable[tuple[str, str, Any]]
) -> list[Violation]:
    """[``token``] ``token`` in no store file, log, git config (the repository's, its
    worktrees', the forge's bare one) or request body ``sent`` ((method, path, body))."""
    places = [
        *(p for p in (lab.repo / ".phasegate").rglob("*") if p.is_file()),
        *(p for p in lab.logs.rglob("*") if p.is_file()),
        lab.repo / ".git" / "config",
        *(lab.repo / ".git" / "worktrees").glob("*/config.worktree"),
        bare / "config",
    ]
    holding = []
    for place in places:
        with contextlib.suppress(FileNotFoundError):  # a worktree's files go as we read
            if token.encode() in place.read_bytes():
                holding.append(str(place))
    holding += [f"{method} {path}" for method, path, body in sent if token in repr(body)]
    return [Violation("token", f"the bot's token in: {holding[:5]}")] if holding else []


def check_merge_line(lab: Lab, bare: Path) -> list[Violation]:
    """[``merges``] One merge commit on the bare repository's main and nothing else
    on its first-parent line but the trial's own commits."""
    merges = bare_git(bare, "rev-list", "--first-parent", "--merges", "main").split()
    line = bare_git(bare, "rev-list", "--first-parent", "main").split()
    if len(merges) == 1 and len(line) == lab.base_commits + 1:
        return []
    detail = (
        f"the bare main: {len(merges)} merge commits, {len(line)} commits on its "
        f"first-parent line; {lab.base_commits} + one merge expected"
    )
    return [Violation("merges", detail)]


def first_verdict(lab: Lab, workflow_id: str) -> datetime | None:
    """When a verifier first answered the workflow (its ``ok`` run), to the second;
    None if no verifier did."""
    answered = [
        r["created_at"]
        for r in lab.store.agent_runs(workflow_id)
        if r["role"] == "verification" and r["outcome"] == "ok"
    ]
    return utc(min(answered)).replace(microsecond=0) if answered else None


def bare_git(bare: Path, *args: str) -> str:
    """``git ARGS`` in the forge's bare repository ``bare``; its output."""
    return subprocess.run(
        ["git", *args], cwd=bare, check=True, capture_output=True, text=True
    ).stdout.strip()


def utc(stamp: object) -> datetime:
    """A store timestamp (datetime or ISO text, naive meaning UTC) as an aware UTC datetime."""
    value = stamp if isinstance(stamp, datetime) else datetime.fromisoformat(str(stamp))
    return value if value.tzinfo else value.replace(tzinfo=UTC)
