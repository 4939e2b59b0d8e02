"""The git side of the fake GitHub: one real bare repository per GitHub repository.

What GitHub computes from git, this computes with git 2.39 on the bare
repository: refs and SHAs, whether a pull request merges cleanly
(``git merge-tree --write-tree``), its commits and line counts, the diff hunk
a review comment points at, and the merge itself (merge, squash or rebase),
written with ``commit-tree`` and a compare-and-swap ``update-ref`` so a head
that moved meanwhile is noticed. ``backend_env`` builds the CGI environment
``git http-backend`` serves smart HTTP with; ``push_change`` is how a test's
developer pushes a branch to any fake forge.

Every git here runs with no system or global configuration: a developer's
``~/.gitconfig`` (hooks, signing, default branch) never changes what the fake does.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "BareRepo",
    "GitError",
    "Identity",
    "PullFacts",
    "backend_env",
    "git_env",
    "push_change",
]

#: Who commits a merge on GitHub's side (as github.com writes it).
GITHUB_COMMITTER = ("GitHub", "noreply@github.com")
_HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,(\d+))? @@")


class GitError(RuntimeError):
    """A git command the fake ran failed; the message holds its stderr."""


@dataclass(frozen=True)
class Identity:
    """A commit author or committer: ``name`` and ``email``."""

    name: str
    email: str


@dataclass(frozen=True)
class PullFacts:
    """What git says of a pull request's head against its base.

    ``mergeable`` is None when either ref is missing; ``commits`` counts
    ``base..head``; ``additions``/``deletions``/``changed_files`` are of the
    three-dot diff (merge base to head), as GitHub counts them.
    """

    base_sha: str | None
    head_sha: str | None
    mergeable: bool | None
    commits: int
    additions: int
    deletions: int
    changed_files: int


def git_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment every git of the fake runs with: no system or global
    config, never a prompt, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_TERMINAL_PROMPT="0",
        GIT_AUTHOR_NAME="fake-github",
        GIT_AUTHOR_EMAIL="fake-github@localhost",
        GIT_COMMITTER_NAME=GITHUB_COMMITTER[0],
        GIT_COMMITTER_EMAIL=GITHUB_COMMITTER[1],
    )
    env.update(extra or {})
    return env


def _run(
    args: list[str],
    *,
    cwd: Path,
    env: Mapping[str, str] | None = None,
    ok: tuple[int, ...] = (0,),
    stdin: str | None = None,
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        ["git", *args],
        cwd=cwd,
        env=git_env(env),
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode not in ok:
        raise GitError(f"git {' '.join(args)}: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def _ident(who: Identity, role: str) -> dict[str, str]:
    return {f"GIT_{role}_NAME": who.name, f"GIT_{role}_EMAIL": who.email}


class BareRepo:
    """A bare repository at ``path`` (created by ``init``)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def git(self, *args: str, env: Mapping[str, str] | None = None) -> str:
        """Run git in the bare repository; its stdout. Raises GitError."""
        return _run(list(args), cwd=self.path, env=env).stdout

    @classmethod
    def made(
        cls, path: Path, default_branch: str, from_path: Path | None, name: str, author: Identity
    ) -> BareRepo:
        """A new bare repository at ``path``, seeded from the repository at
        ``from_path`` or else given a first commit by ``author`` holding a README
        titled ``name`` (as a fake Gitea or GitLab makes one)."""
        bare = cls(path)
        bare.init(default_branch)
        if from_path is not None:
            bare.seed(from_path)
        else:
            bare.first_commit(
                default_branch, {"README.md": f"# {name}\n"}, "Initial commit", author
            )
        return bare

    def init(self, default_branch: str) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        _run(["init", "--quiet", "--bare", f"--initial-branch={default_branch}"], cwd=self.path)
        # A push of a branch the server already merged into must not be refused
        # for rewriting: people force-push their branches on GitHub.
        self.git("config", "receive.denyNonFastForwards", "false")
        self.git("config", "http.receivepack", "true")

    def seed(self, source: Path) -> None:
        """Push every branch and tag of the repository at ``source`` here."""
        _run(
            [
                "push",
                "--quiet",
                str(self.path),
                "refs/heads/*:refs/heads/*",
                "refs/tags/*:refs/tags/*",
            ],
            cwd=source,
        )

    def first_commit(
        self, branch: str, files: Mapping[str, str], message: str, author: Identity
    ) -> str:
        """Make ``branch``'s first commit holding ``files`` (path → text); its SHA."""
        entries = []
        for name, text in sorted(files.items()):
            blob = _run(["hash-object", "-w", "--stdin"], cwd=self.path, stdin=text).stdout.strip()
            entries.append(f"100644 blob {blob}\t{name}\n")
        tree = _run(["mktree"], cwd=self.path, stdin="".join(entries)).stdout.strip()
        sha = self.git("commit-tree", tree, "-m", message, env=_ident(author, "AUTHOR")).strip()
        self.git("update-ref", f"refs/heads/{branch}", sha, "")
        return sha

    def sha(self, ref: str) -> str | None:
        """The commit ``ref`` (a branch, tag or SHA) names, or None."""
        proc = _run(
            ["rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"], cwd=self.path, ok=(0, 1, 128)
        )
        return (proc.stdout.strip() or None) if proc.returncode == 0 else None

    def branch_sha(self, branch: str) -> str | None:
        return self.sha(f"refs/heads/{branch}")

    def branches(self) -> list[str]:
        out = self.git("for-each-ref", "--format=%(refname:short)", "refs/heads/")
        return out.split()

    def merge_tree(self, base: str, head: str) -> str | None:
        """The tree of merging ``head`` into ``base`` (SHAs), or None on a conflict."""
        proc = _run(
            ["merge-tree", "--write-tree", "--no-messages", base, head], cwd=self.path, ok=(0, 1)
        )
        return proc.stdout.split()[0] if proc.returncode == 0 else None

    def facts(self, base: str, head: str) -> PullFacts:
        """What git says of branch ``head`` against branch ``base`` now."""
        base_sha, head_sha = self.branch_sha(base), self.branch_sha(head)
        if base_sha is None or head_sha is None:
            return PullFacts(base_sha, head_sha, None, 0, 0, 0, 0)
        mergeable = self.merge_tree(base_sha, head_sha) is not None
        commits = int(self.git("rev-list", "--count", f"{base_sha}..{head_sha}").strip())
        adds = dels = files = 0
        for line in self.git("diff", "--numstat", f"{base_sha}...{head_sha}").splitlines():
            added, deleted, _ = line.split("\t", 2)
            files += 1
            # Binary files count as changed with no lines, as on GitHub.
            adds += int(added) if added != "-" else 0
            dels += int(deleted) if deleted != "-" else 0
        return PullFacts(base_sha, head_sha, mergeable, commits, adds, dels, files)

    def diff_hunk(self, base_sha: str, head_sha: str, path: str, line: int) -> str | None:
        """The pull request diff's hunk of ``path`` up to new-file line ``line``
        (GitHub's ``diff_hunk``), or None when the diff does not show that line."""
        diff = self.git("diff", "--no-color", "-U3", f"{base_sha}...{head_sha}", "--", path)
        hunk: list[str] = []
        new_line = 0
        for text in diff.splitlines():
            match = _HUNK.match(text)
            if match:
                hunk, new_line = [text], int(match.group(1)) - 1
                continue
            if not hunk or text.startswith("\\"):
                continue
            hunk.append(text)
            if not text.startswith("-"):
                new_line += 1
                if new_line == line:
                    return "\n".join(hunk)
        return None

    def merge(
        self,
        base: str,
        head_sha: str,
        method: str,
        title: str,
        message: str,
        author: Identity,
    ) -> str:
        """Merge ``head_sha`` into branch ``base`` the way ``method`` says
        (``merge``: a merge commit; ``squash``: one commit; ``rebase``: the
        commits replayed). Returns the new tip of ``base`` (GitHub's
        ``merge_commit_sha``). Raises GitError on a conflict or when ``base``
        moved while merging."""
        base_sha = self.branch_sha(base)
        if base_sha is None:
            raise GitError(f"no branch {base}")
        text = f"{title}\n\n{message}" if message else title
        ident = _ident(author, "AUTHOR")
        if method == "rebase":
            new = self._replay(base_sha, head_sha)
        else:
            tree = self.merge_tree(base_sha, head_sha)
            if tree is None:
                raise GitError(f"merge conflict between {base} and {head_sha}")
            parents = ["-p", base_sha] + (["-p", head_sha] if method == "merge" else [])
            new = self.git("commit-tree", tree, *parents, "-m", text, env=ident).strip()
        # Compare-and-swap: a push to base meanwhile makes this fail, never lost.
        self.git("update-ref", f"refs/heads/{base}", new, base_sha)
        return new

    def _replay(self, base_sha: str, head_sha: str) -> str:
        """Cherry-pick ``base..head`` (merges left out) onto ``base`` in a throwaway
        worktree, keeping each commit's author; the last SHA."""
        commits = self.git(
            "rev-list", "--reverse", "--no-merges", f"{base_sha}..{head_sha}"
        ).split()
        with tempfile.TemporaryDirectory(prefix="fake-github-rebase-") as tmp:
            work = Path(tmp) / "w"
            self.git("worktree", "add", "--quiet", "--detach", str(work), base_sha)
            try:
                for sha in commits:
                    _run(
                        ["cherry-pick", "--allow-empty", "--keep-redundant-commits", sha], cwd=work
                    )
                return _run(["rev-parse", "HEAD"], cwd=work).stdout.strip()
            except GitError:
                _run(["cherry-pick", "--abort"], cwd=work, ok=(0, 128))
                raise
            finally:
                self.git("worktree", "remove", "--force", str(work))


def backend_env(
    project_root: Path,
    path_info: str,
    method: str,
    query: str,
    headers: Mapping[str, str],
    remote_user: str,
) -> dict[str, str]:
    """The CGI environment for one ``git http-backend`` request (RFC 3875 names).

    ``headers`` are the request's, lower-case names; ``Content-Type``,
    ``Content-Length``, ``Content-Encoding`` (git gzips upload-pack requests)
    and ``Git-Protocol`` (protocol v2) reach the backend.
    """
    env = git_env(
        {
            "GIT_PROJECT_ROOT": str(project_root),
            "GIT_HTTP_EXPORT_ALL": "1",
            "PATH_INFO": path_info,
            "REQUEST_METHOD": method,
            "QUERY_STRING": query,
            "REMOTE_USER": remote_user,
            "REMOTE_ADDR": "127.0.0.1",
            "GATEWAY_INTERFACE": "CGI/1.1",
            "SERVER_PROTOCOL": "HTTP/1.1",
        }
    )
    for header, variable in (
        ("content-type", "CONTENT_TYPE"),
        ("content-length", "CONTENT_LENGTH"),
        ("content-encoding", "HTTP_CONTENT_ENCODING"),
        ("git-protocol", "GIT_PROTOCOL"),
    ):
        if header in headers:
            env[variable] = headers[header]
    return env


def push_change(
    git: Callable[..., str], clone_url: str, checkout: Path, branch: str, files: Mapping[str, str]
) -> str:
    """Clone ``clone_url`` into ``checkout``, commit ``files`` there on a new
    ``branch`` as a developer and push it; its SHA. ``git(*args, cwd=...)``
    runs each step (the caller's, failing the test when one fails)."""
    git("clone", "--quiet", clone_url, str(checkout))
    git("checkout", "--quiet", "-b", branch, cwd=checkout)
    for path, text in files.items():
        (checkout / path).write_text(text)
    git("add", "-A", cwd=checkout)
    git("-c", "user.name=Dev", "-c", "user.email=dev@example.com",
        "commit", "--quiet", "-m", f"change {branch}", cwd=checkout)  # fmt: skip
    git("push", "--quiet", "origin", branch, cwd=checkout)
    return git("rev-parse", "HEAD", cwd=checkout)
