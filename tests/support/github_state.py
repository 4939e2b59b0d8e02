"""The fake GitHub's model: users, repositories, issues, pull requests and what people do.

``GitHub`` holds everything a ``GitHubServer`` serves, behind one lock (the
HTTP threads and the test's thread share it). Its operations take the user
who acts and keep GitHub's rules of meaning — numbers shared by issues and
pull requests, labels made on first use, a merge refused when the head moved
(409) or the change conflicts (405), closing keywords closing issues when a
pull request merges into the default branch — and raise ``GitHubError`` with
GitHub's status and message. Who may call what over HTTP (tokens,
permissions) is the server's part; a test speaking for people through this
API (``label``, ``comment``, ``review``, ``check_run``, ``merge_by_hand`` …)
is taken at its word, so it can set up what a read-only person could never do.

Times are UTC, whole seconds (GitHub's resolution), from ``clock``; what a
test does for a person takes ``at=`` to place it in time.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from phasegate.forge.base import PERMISSIONS

from support.github_commits import commit_shape, reactions
from support.github_git import BareRepo
from support.github_json import Json, Shapes
from support.github_model import (
    CHECK_CONCLUSIONS,
    CHECK_STATUSES,
    STATUS_STATES,
    App,
    CheckRun,
    CommitStatus,
    Event,
    GitHubError,
    Issue,
    IssueComment,
    Label,
    Repo,
    User,
    invalid,
    not_found,
    utc_now,
)
from support.github_pulls import PullRequests

__all__ = ["GitHub"]


class GitHub(PullRequests):
    """Everything the fake GitHub knows; bare repositories live under ``root``."""

    def __init__(self, root: Path, clock: Callable[[], datetime] = utc_now) -> None:
        self.root = root
        self.clock = clock
        self.lock = threading.RLock()
        self.users: dict[str, User] = {}  # lower-case login → user
        self.repos: dict[str, Repo] = {}  # lower-case full name → repository
        self.apps: dict[int, App] = {}
        self.tokens: dict[str, tuple[User, datetime | None]] = {}  # token → user, expiry
        #: GitHub works out ``mergeable`` in the background: after a pull request
        #: opens or its head or base moves, this many reads of it say null.
        self.mergeable_unknown_reads = 0
        self._ids = 1000

    # -- ids, time, lookups --------------------------------------------------------
    def announce(
        self, r: Repo, event: str, sender: User, render: Callable[[Shapes], dict[str, Any]]
    ) -> None:
        """Webhook ``event`` happened on ``r`` (``render``: its action and objects in
        the REST shapes): the server delivers it to the repository's hooks
        (``support.github_hooks``); the bare model delivers nothing."""
        return None

    def _id(self) -> int:
        self._ids += 1
        return self._ids

    def _at(self, at: datetime | None) -> datetime:
        """``at``, or the clock's now, as GitHub keeps times: UTC, whole seconds."""
        return (at or self.clock()).astimezone(UTC).replace(microsecond=0)

    def user(self, login: str) -> User:
        """The user ``login``; GitHubError 404 if none."""
        found = self.users.get(login.lower())
        if found is None:
            raise not_found()
        return found

    def repo(self, full_name: str) -> Repo:
        """Repository ``owner/name`` (any case); GitHubError 404 if none."""
        found = self.repos.get(full_name.lower())
        if found is None:
            raise not_found()
        return found

    def issue(self, repo: str | Repo, number: int) -> Issue:
        r = self.repo(repo) if isinstance(repo, str) else repo
        found = r.issues.get(number)
        if found is None:
            raise not_found()
        return found

    def pull(self, repo: str | Repo, number: int) -> Issue:
        """The pull request ``number`` (its issue, with ``pull`` set); 404 otherwise."""
        found = self.issue(repo, number)
        if found.pull is None:
            raise not_found()
        return found

    def user_for_token(self, token: str) -> User | None:
        """Who ``token`` acts as, or None (unknown or expired)."""
        with self.lock:
            found = self.tokens.get(token)
            if found is None or (found[1] is not None and found[1] <= utc_now()):
                return None
            return found[0]

    # -- people and repositories -----------------------------------------------------
    def add_user(
        self,
        login: str,
        token: str | None = None,
        *,
        type: str = "User",
        permissions: Mapping[str, str] | None = None,
    ) -> User:
        """Add user ``login`` authenticating with ``token`` (one is made if None;
        see ``User.token``), granted ``permissions`` (repository → permission)."""
        with self.lock:
            if login.lower() in self.users:
                raise ValueError(f"user {login} exists")
            user = User(self._id(), login, type, token or f"ghp_{secrets.token_hex(18)}")
            self.users[login.lower()] = user
            self.tokens[user.token] = (user, None)  # type: ignore[index]
            for repo, permission in (permissions or {}).items():
                self.grant(repo, login, permission)
            return user

    def create_repo(
        self,
        owner: str,
        name: str,
        *,
        from_path: Path | None = None,
        default_branch: str = "main",
        private: bool = False,
        description: str | None = None,
        auto_init: bool = False,
    ) -> Repo:
        """Create ``owner/name`` with a bare repository (``owner`` is added as a
        user if new). ``from_path``: push that repository's branches and tags;
        ``auto_init``: a first commit with a README, as GitHub makes one.
        GitHubError 422 if it exists."""
        with self.lock:
            user = self.users.get(owner.lower()) or self.add_user(owner)
            if f"{owner}/{name}".lower() in self.repos:
                raise invalid("Repository", "name", "custom", "name already exists on this account")
            git = BareRepo(self.root / user.login / f"{name}.git")
            git.init(default_branch)
            now = self._at(None)
            repo = Repo(self._id(), user, name, git, now, default_branch, private, description)
            if from_path is not None:
                git.seed(Path(from_path))
                repo.pushed_at = now
            elif auto_init:
                git.first_commit(
                    default_branch, {"README.md": f"# {name}\n"}, "Initial commit", user.identity
                )
                repo.pushed_at = now
            self.repos[repo.full_name.lower()] = repo
            return repo

    def grant(self, repo: str, login: str, permission: str) -> None:
        """Make ``login`` a collaborator on ``repo`` with ``permission`` (one of PERMISSIONS)."""
        if permission not in PERMISSIONS:
            raise ValueError(f"permission must be one of {PERMISSIONS}")
        with self.lock:
            self.repo(repo).collaborators[self.user(login).login] = permission

    def permission(self, repo: str | Repo, login: str) -> str:
        """``login``'s permission on ``repo``: its owner is admin, collaborators
        what they were granted, an installed App's bot write, others read on a
        public repository and none on a private one."""
        with self.lock:
            r = self.repo(repo) if isinstance(repo, str) else repo
            if login.lower() == r.owner.login.lower():
                return "admin"
            for who, perm in r.collaborators.items():
                if who.lower() == login.lower():
                    return perm
            for app in self.apps.values():
                if app.bot.login.lower() == login.lower() and self.installed(app, r):
                    return "write"
            return "none" if r.private else "read"

    def installed(self, app: App, repo: Repo) -> bool:
        if repo.owner is not app.owner:
            return False
        return app.repos is None or repo.name.lower() in app.repos

    # -- issues, labels, comments ------------------------------------------------------
    def _number(self, repo: Repo) -> int:
        return max(repo.issues, default=0) + 1

    def open_issue(
        self,
        repo: str,
        title: str,
        body: str | None,
        by: str,
        *,
        labels: Iterable[str] = (),
        at: datetime | None = None,
    ) -> Issue:
        """``by`` files an issue (labelled ``labels``, each with a labeled event)."""
        with self.lock:
            r, user, now = self.repo(repo), self.user(by), self._at(at)
            issue = Issue(self._id(), self._number(r), title, body, user, now, now)
            r.issues[issue.number] = issue
            self.add_labels(repo, issue.number, labels, by, at=now)
            return issue

    def edit_issue(
        self,
        repo: str,
        number: int,
        by: str,
        *,
        title: str | None = None,
        body: str | None = None,
        state: str | None = None,
        state_reason: str | None = None,
        at: datetime | None = None,
    ) -> Issue:
        """``by`` edits issue (or pull request) ``number``: title, body, state
        (open|closed; a closed pull request stays unmerged)."""
        with self.lock:
            issue, user, now = self.issue(repo, number), self.user(by), self._at(at)
            if state not in (None, "open", "closed"):
                raise invalid("Issue", "state", "invalid")
            issue.title = title if title is not None else issue.title
            issue.body = body if body is not None else issue.body
            if state is not None and state != issue.state:
                if state == "open" and issue.pull and issue.pull.merged_at:
                    raise invalid(
                        "PullRequest", "state", "invalid", "merged pull requests stay closed"
                    )
                self._set_state(self.repo(repo), issue, state, user, now, state_reason)
            issue.updated_at = now
            return issue

    def _set_state(
        self, repo: Repo, issue: Issue, state: str, by: User, now: datetime, reason: str | None
    ) -> None:
        issue.state = state
        issue.closed_at = now if state == "closed" else None
        issue.closed_by = by if state == "closed" else None
        issue.state_reason = (reason or "completed") if state == "closed" else "reopened"
        issue.events.append(
            Event(self._id(), "closed" if state == "closed" else "reopened", by, now)
        )
        if issue.pull and state == "closed" and issue.pull.merged_at is None:
            issue.pull.frozen = self.pull_facts(repo, issue)
        elif issue.pull and state == "open":
            issue.pull.frozen = None

    def label_named(
        self, repo: Repo, name: str, color: str = "ededed", description: str | None = None
    ) -> Label:
        """The repository's label ``name`` (any case), made if new, as adding one does."""
        label = repo.labels.get(name.lower())
        if label is None:
            label = Label(self._id(), name, color, description)
            repo.labels[name.lower()] = label
        return label

    def create_label(
        self, repo: str, name: str, color: str = "ededed", description: str | None = None
    ) -> Label:
        """A new repository label; GitHubError 422 ``already_exists`` if it is there."""
        with self.lock:
            r = self.repo(repo)
            if name.lower() in r.labels:
                raise invalid("Label", "name", "already_exists")
            return self.label_named(r, name, color.lstrip("#"), description)

    def add_labels(
        self, repo: str, number: int, names: Iterable[str], by: str, *, at: datetime | None = None
    ) -> list[Label]:
        """``by`` labels issue ``number`` (a labeled event each new one); all its labels."""
        with self.lock:
            r, user, now = self.repo(repo), self.user(by), self._at(at)
            issue = self.issue(r, number)
            for name in names:
                label = self.label_named(r, name)
                if label not in issue.labels:
                    issue.labels.append(label)
                    issue.events.append(Event(self._id(), "labeled", user, now, label))
                    issue.updated_at = now
                    self.announce(r, "issues", user, _labeled(r, issue, label))
            return list(issue.labels)

    def label(
        self, repo: str, number: int, name: str, by: str, *, at: datetime | None = None
    ) -> None:
        """A person ``by`` puts label ``name`` on issue ``number``."""
        self.add_labels(repo, number, [name], by, at=at)

    def unlabel(
        self, repo: str, number: int, name: str, by: str, *, at: datetime | None = None
    ) -> list[Label]:
        """``by`` takes label ``name`` off issue ``number``; the labels left.
        GitHubError 404 ``Label does not exist`` if it had none of that name."""
        with self.lock:
            r, user, now = self.repo(repo), self.user(by), self._at(at)
            issue = self.issue(r, number)
            found = [x for x in issue.labels if x.name.lower() == name.lower()]
            if not found:
                raise GitHubError(404, "Label does not exist")
            issue.labels.remove(found[0])
            issue.events.append(Event(self._id(), "unlabeled", user, now, found[0]))
            issue.updated_at = now
            return list(issue.labels)

    def comment(
        self, repo: str, number: int, body: str, by: str, *, at: datetime | None = None
    ) -> IssueComment:
        """``by`` comments on issue or pull request ``number`` (the conversation)."""
        with self.lock:
            r, user, now = self.repo(repo), self.user(by), self._at(at)
            issue = self.issue(r, number)
            said = IssueComment(self._id(), user, body, now, now)
            issue.comments.append(said)
            issue.updated_at = now
            self.announce(
                r,
                "issue_comment",
                user,
                lambda s: {
                    "action": "created",
                    "issue": _hooked_issue(s, r, issue),
                    "comment": {
                        **s.comment(r, issue, said),
                        "performed_via_github_app": None,
                        "reactions": reactions(
                            f"{s.api}/repos/{r.full_name}/issues/comments/{said.id}"
                        ),
                    },
                },
            )
            return said

    # -- CI -----------------------------------------------------------------------------------
    def check_run(
        self,
        repo: str,
        sha: str,
        name: str,
        status: str = "completed",
        conclusion: str | None = None,
        *,
        title: str | None = None,
        summary: str | None = None,
        text: str | None = None,
        details_url: str | None = None,
        at: datetime | None = None,
    ) -> CheckRun:
        """CI posts a check run ``name`` on commit ``sha`` (``status`` queued,
        in_progress or completed; ``conclusion`` required once completed)."""
        _check_state(status, conclusion)
        with self.lock:
            r, now = self.repo(repo), self._at(at)
            started = None if status == "queued" else now
            run = CheckRun(
                self._id(),
                sha,
                name,
                status,
                conclusion,
                started,
                now if status == "completed" else None,
                title,
                summary,
                text,
                details_url,
            )
            r.check_runs.append(run)
            self.announce(r, "check_run", self._ci, self._run_event(r, run, "created"))
            return run

    def update_check_run(
        self,
        repo: str,
        run_id: int,
        status: str,
        conclusion: str | None = None,
        *,
        title: str | None = None,
        summary: str | None = None,
        text: str | None = None,
        name: str | None = None,
        details_url: str | None = None,
        at: datetime | None = None,
    ) -> CheckRun:
        """CI moves check run ``run_id`` on (e.g. in_progress → completed); what is
        None is kept."""
        _check_state(status, conclusion)
        with self.lock:
            r, now = self.repo(repo), self._at(at)
            run = next((x for x in r.check_runs if x.id == run_id), None)
            if run is None:
                raise not_found()
            run.status, run.conclusion = status, conclusion
            run.started_at = run.started_at or (None if status == "queued" else now)
            run.completed_at = now if status == "completed" else None
            run.title = title if title is not None else run.title
            run.summary = summary if summary is not None else run.summary
            run.text = text if text is not None else run.text
            run.name = name if name is not None else run.name
            run.details_url = details_url if details_url is not None else run.details_url
            action = "completed" if status == "completed" else "created"
            self.announce(r, "check_run", self._ci, self._run_event(r, run, action))
            return run

    def status(
        self,
        repo: str,
        sha: str,
        context: str,
        state: str,
        by: str,
        *,
        description: str | None = None,
        target_url: str | None = None,
        at: datetime | None = None,
    ) -> CommitStatus:
        """``by`` (a CI user) sets commit status ``context`` of ``sha`` to ``state``
        (error, failure, pending, success)."""
        if state not in STATUS_STATES:
            raise ValueError(f"state must be one of {STATUS_STATES}")
        with self.lock:
            r, user, now = self.repo(repo), self.user(by), self._at(at)
            posted = CommitStatus(
                self._id(), sha, context, state, description, target_url, user, now
            )
            r.statuses.append(posted)
            self.announce(r, "status", user, _status_event(r, posted))
            return posted

    @property
    def _ci(self) -> User:
        """Who check runs come from: GitHub Actions' bot."""
        return self.users.get("github-actions[bot]") or self.add_user(
            "github-actions[bot]", type="Bot"
        )

    def _run_event(self, r: Repo, run: CheckRun, action: str) -> Callable[[Shapes], Json]:
        """A ``check_run`` event's payload: the run with its open pull requests."""
        pulls = [
            i for i in r.issues.values()
            if i.pull is not None and i.state == "open"
            and self.pull_facts(r, i).head_sha == run.head_sha
        ]  # fmt: skip

        def render(s: Shapes) -> Json:
            prs = [s.pull(r, i, self.pull_facts(r, i), full=False) for i in pulls]
            refs = [{k: p[k] for k in ("id", "number", "url", "head", "base")} for p in prs]
            branch = prs[0]["head"]["ref"] if prs else None
            suite = {"id": run.id, "head_branch": branch, "head_sha": run.head_sha}
            shown = {**s.check_run(r, run), "pull_requests": refs, "check_suite": suite}
            return {"action": action, "check_run": shown}

        return render

    def protect(self, repo: str, branch: str, required: Iterable[str]) -> None:
        """Protect ``branch``: a pull request merges into it only once each of the
        ``required`` checks (check run or status names) passed on its head."""
        with self.lock:
            self.repo(repo).protection[branch] = tuple(required)

    # -- GitHub Apps ----------------------------------------------------------------------------
    def add_app(
        self,
        app_id: int,
        public_key_pem: str,
        installation_id: int,
        *,
        slug: str = "phasegate-app",
        owner: str | None = None,
        repos: Iterable[str] | None = None,
    ) -> App:
        """Install GitHub App ``app_id`` (verified with ``public_key_pem``) as
        ``installation_id`` on ``owner``'s repositories (``repos`` names, None:
        all; ``owner`` None: the first repository's owner). Its tokens act as
        ``SLUG[bot]`` with write permission."""
        with self.lock:
            if owner is None:
                if not self.repos:
                    raise ValueError("add_app needs an owner or a repository first")
                owner = next(iter(self.repos.values())).owner.login
            bot = self.add_user(f"{slug}[bot]", type="Bot")
            names = frozenset(n.lower() for n in repos) if repos is not None else None
            app = App(
                app_id,
                slug,
                public_key_pem,
                installation_id,
                self.user(owner),
                bot,
                names,
                self._at(None),
            )
            self.apps[app_id] = app
            return app

    def app_for_installation(self, installation_id: int) -> App:
        for app in self.apps.values():
            if app.installation_id == installation_id:
                return app
        raise not_found()

    def mint_token(self, app: App, expires_at: datetime) -> str:
        """A new installation token of ``app`` valid until ``expires_at``."""
        with self.lock:
            token = f"ghs_{secrets.token_hex(18)}"
            self.tokens[token] = (app.bot, expires_at)
            return token

    # -- what tests look at -------------------------------------------------------------------
    def counts(self, repo: str) -> dict[str, int]:
        """Issues, pulls, comments, reviews and merges ``repo`` holds (see ``Repo.counts``)."""
        with self.lock:
            return self.repo(repo).counts()

    def bare_path(self, repo: str) -> Path:
        """The bare repository behind ``repo``."""
        return self.repo(repo).git.path


def _check_state(status: str, conclusion: str | None) -> None:
    """ValueError unless ``status`` is one of CHECK_STATUSES and a conclusion
    (one of CHECK_CONCLUSIONS) comes exactly with ``completed``."""
    if status not in CHECK_STATUSES:
        raise ValueError(f"status must be one of {CHECK_STATUSES}")
    if (status == "completed") != (conclusion is not None) or (
        conclusion is not None and conclusion not in CHECK_CONCLUSIONS
    ):
        raise ValueError(f"a completed run has a conclusion, one of {CHECK_CONCLUSIONS}")


def _labeled(r: Repo, issue: Issue, label: Label) -> Callable[[Shapes], Json]:
    return lambda s: {
        "action": "labeled",
        "issue": _hooked_issue(s, r, issue),
        "label": s.label(r, label),
    }


def _hooked_issue(s: Shapes, r: Repo, issue: Issue) -> Json:
    """An issue as a webhook carries it: the REST shape and its reactions."""
    shape = s.issue(r, issue)
    return {**shape, "reactions": reactions(str(shape["url"]))}


def _status_event(r: Repo, posted: CommitStatus) -> Callable[[Shapes], Json]:
    """A ``status`` event's payload: the status and the branches whose tip it is on."""
    tips = [b for b in r.git.branches() if r.git.branch_sha(b) == posted.sha]

    def render(s: Shapes) -> Json:
        commit = f"{s.api}/repos/{r.full_name}/commits/{posted.sha}"
        return {
            **s.status(r, posted),
            "sha": posted.sha,
            "name": r.full_name,
            "commit": commit_shape(s.api, r, posted.sha),
            "branches": [
                {
                    "name": b,
                    "commit": {"sha": posted.sha, "url": commit},
                    "protected": b in r.protection,
                }
                for b in tips
            ],
        }

    return render
