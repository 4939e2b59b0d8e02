"""Running the real ``git``: one way to call it, and the errors it raises.

Every git call phasegate makes goes through ``run_git`` (whatever it exits
with) or ``git`` (raising on failure), with the same environment: never
prompting, in the C locale so the messages phasegate reads stay English.

A failure that reads as transient (another git process holds a lock: git
says so in its stderr, whatever the exit code) is retried a few times with a
short jittered backoff; when it persists, ``GitTransient`` is raised — from
``run_git`` too, since an exit code a caller reads as an answer
(``merge-base --is-ancestor`` exit 1, a merge's conflict exit 1) must never be
a lock's exit code mistaken for it. Any other exit is returned (``run_git``)
or raised as ``GitError`` (``git``) at once, never retried.

Nothing in a repository's configuration runs code inside phasegate's own git:
every call passes ``HARDENED`` (hooks and fsmonitor off, no signing program)
and a ``diff``/``log``/``show`` never runs an external diff or a textconv, nor
looks inside a nested repository (submodules ignored).
Filter drivers (``filter.<x>.clean``, git-lfs) and merge drivers stay on: they
come from the configuration only, never from a file in the worktree, and the
configuration an agent could reach is guarded around every agent run
(``phasegate.git.guard``); what they start gets phasegate's environment without
its secrets (``_git_env``).

Every ref-moving command phasegate runs (``REF_MOVING``) appends the refs it
moved to the repository's ref ledger (``<common>/phasegate/ref-ledger``, one
JSON line per ref; ``phasegate.git.refs``), under a shared flock on
``<common>/phasegate/refs.lock`` that the guard takes exclusively to compare:
a ref that moved during an agent run is the agent's unless the ledger says
phasegate moved it there. The refs before and after, and the common directory,
are read from git's own files when they are plain (``phasegate.git.files``; git
is asked otherwise), so the ledger costs no git process of its own. Nothing
here caches what git says: each answer is read afresh, whatever thread asks.

``recording()`` lists every git process phasegate starts while it is active
(benchmarks/lifecycle.py counts a lifecycle's with it); costless when off.

Errors::

    PhasegateError
     └── GitError            a git command failed (the command and its stderr)
          ├── DirtyCheckout  the checkout holding the base has edits in a merge's way
          └── GitTransient   a failure that reads as passing (a lock held, a ref
                             locked), still failing after bounded retries; never
                             a conflict
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from phasegate.core.redaction import SECRET_NAME
from phasegate.git import files as _gitfs
from phasegate.git.errors import DirtyCheckout, GitError, GitTransient
from phasegate.git.refs import (
    LEDGER,
    REFS_LOCK,
    ledger_turn,
    read_ledger,
    record_refs,
    refs_lock,
    repository_flock,
)
from phasegate.proc.changes import changes, note_change

__all__ = [
    "HARDENED",
    "IDENTITY",
    "LEDGER",
    "READ_SUBCOMMANDS",
    "REF_MOVING",
    "REFS_LOCK",
    "TRANSIENT_ATTEMPTS",
    "changes",
    "common_dir",
    "DirtyCheckout",
    "GitCall",
    "GitError",
    "GitTransient",
    "git",
    "is_transient",
    "list_refs",
    "note_change",
    "read_ledger",
    "record_refs",
    "recording",
    "refs_lock",
    "repository_flock",
    "run_git",
    "run_git_unrecorded",
]


#: Who phasegate's own commits and merges are by.
IDENTITY = ("-c", "user.name=phasegate", "-c", "user.email=phasegate@localhost")

#: How many times a transiently failing git command is run in all, and the
#: first backoff (seconds, doubled each time, with up to 100% jitter).
TRANSIENT_ATTEMPTS = 5
_BACKOFF_S = 0.05

# What git prints when another process holds one of its locks (lockfile.c,
# refs/files-backend.c, config.c, read-cache.c) or the OS refuses for now. A
# ref that cannot be locked for a lasting reason (a ref in the way of its
# name, a directory there) is not among them: retrying cannot help.
_TRANSIENT = re.compile(
    r"Unable to create '[^']*\.lock': File exists"
    r"|cannot lock ref '[^']*': (?!'[^']*' exists|there is a non-empty directory"
    r"|reference already exists|unable to resolve reference|reference is missing)"
    r"|could not lock config file"
    r"|Another git process seems to be running"
    r"|unable to write new index file"
    r"|Resource temporarily unavailable"
    # another process's `git worktree prune` removed the empty .git/worktrees between
    # this `worktree add` creating it and creating its entry: nothing was made yet
    r"|could not create directory of '[^']*worktrees/[^']*': No such file or directory"
    # another process's `worktree add` made its entry and has not written its commondir
    # yet: a command that reads every worktree (branch, status) finds it empty
    r"|failed to read [^\n]*worktrees/[^/\n]*/(?:commondir|gitdir)",
    re.IGNORECASE,
)


def is_transient(proc: subprocess.CompletedProcess[str]) -> bool:
    """Whether a finished git command failed the way lock contention fails."""
    return proc.returncode != 0 and bool(_TRANSIENT.search(proc.stderr or ""))


#: phasegate's own git calls never start git's automatic gc or maintenance: it detaches
#: into the background (a process no journal knows, outliving its workflow) and leaves
#: ``objects/maintenance.lock`` behind when a kill lands in it.
_NO_BACKGROUND = ("-c", "gc.auto=0", "-c", "maintenance.auto=false")

#: What every git call of phasegate's passes so that nothing an agent could plant in
#: a configuration or a hooks directory runs with phasegate's environment: no hook
#: (``/dev/null`` is no directory), no fsmonitor daemon or script, and no signing
#: program (phasegate's commits are phasegate's, never signed with a person's key).
HARDENED = (
    "-c",
    "core.hooksPath=/dev/null",
    "-c",
    "core.fsmonitor=false",
    "-c",
    "commit.gpgSign=false",
    "-c",
    "tag.gpgSign=false",
    # A repository nested in a worktree has a .git of the agent's making: git would
    # run its filters and fsmonitor to see whether it is dirty (second trial).
    "-c",
    "diff.ignoreSubmodules=all",
    "-c",
    "submodule.recurse=false",
    "-c",
    "status.submoduleSummary=false",
)

#: Subcommands that run an external diff or a textconv filter unless told not to.
_DIFFING = frozenset({"diff", "log", "show"})

#: Subcommands that can move a ref; phasegate's own runs of them are in the ledger.
REF_MOVING = frozenset(
    {
        "am",
        "branch",
        "checkout",
        "cherry-pick",
        "commit",
        "fetch",
        "merge",
        "pull",
        "push",
        "rebase",
        "reset",
        "revert",
        "stash",
        "switch",
        "symbolic-ref",
        "tag",
        "update-ref",
    }
)


def _subcommand(args: Sequence[str]) -> tuple[int, str]:
    """Where git's subcommand is in ``args`` (after any ``-c key=value``), and its name."""
    i = 0
    while i < len(args) and args[i] == "-c":
        i += 2
    return i, (args[i] if i < len(args) else "")


@dataclass(frozen=True)
class GitCall:
    """One git process phasegate ran, as ``recording`` keeps it: ``args`` as the
    caller passed them (without ``HARDENED``), ``cwd``, ``input`` (stdin or None),
    its exit code, its wall time in seconds, and ``bookkeeping``: run by this
    module for the ref ledger or the worktree lock, not asked for by a caller."""

    args: tuple[str, ...]
    cwd: str
    input: str | None
    returncode: int
    seconds: float
    bookkeeping: bool

    @property
    def subcommand(self) -> str:
        return _subcommand(self.args)[1]


# Active recorders (benchmarks and tests counting calls): every thread's calls go to
# each. A list looked at once per call, so counting costs nothing when none is active.
_RECORDERS: list[list[GitCall]] = []
_RECORDERS_LOCK = threading.Lock()
_LOCAL = threading.local()


#: Subcommands that never change a checkout or a ref (the rest may: ``note_change``).
READ_SUBCOMMANDS = frozenset(
    {
        "cat-file",
        "diff-index",
        "for-each-ref",
        "log",
        "ls-files",
        "ls-tree",
        "merge-base",
        "rev-list",
        "rev-parse",
        "show",
        "status",
    }
)


def _may_change(at: int, name: str, args: Sequence[str]) -> bool:
    if name == "diff":
        return any(a.startswith("--output") for a in args[at + 1 :])
    if name == "config":
        return not any(a in ("--get", "--get-all", "--list", "-l") for a in args[at + 1 :])
    if name == "remote":
        return list(args[at + 1 : at + 2]) != ["get-url"]
    return name not in READ_SUBCOMMANDS


@contextmanager
def recording() -> Iterator[list[GitCall]]:
    """Every git process phasegate runs while the block runs, in any thread, appended
    to the list yielded (``GitCall``s in the order they finished). For counting
    (benchmarks/lifecycle.py, tests/test_git_calls.py); nothing
    reads it to decide anything."""
    calls: list[GitCall] = []
    with _RECORDERS_LOCK:
        _RECORDERS.append(calls)
    try:
        yield calls
    finally:
        with _RECORDERS_LOCK:
            _RECORDERS.remove(calls)


@contextmanager
def _bookkeeping() -> Iterator[None]:
    """Calls made in the block are this module's own (``GitCall.bookkeeping``)."""
    outer = getattr(_LOCAL, "bookkeeping", False)
    _LOCAL.bookkeeping = True
    try:
        yield
    finally:
        _LOCAL.bookkeeping = outer


def _run_once(
    args: Sequence[str], cwd: Path | str, input: str | None, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    at, name = _subcommand(args)
    ran = args
    if name in _DIFFING:
        ran = [*args[: at + 1], "--no-ext-diff", "--no-textconv", *args[at + 1 :]]
    changing = _may_change(at, name, args)
    if changing:
        note_change()
    started = time.perf_counter()
    try:
        proc = subprocess.run(
            ["git", *_NO_BACKGROUND, *HARDENED, *ran],
            cwd=cwd,
            capture_output=True,
            encoding="utf-8",
            errors="replace",
            input=input,
            env={**_git_env(), **(env or {})},
        )
    finally:
        if changing:  # after too: a look taken while it ran may have seen half of it
            note_change()
    if _RECORDERS:
        call = GitCall(
            tuple(args),
            str(cwd),
            input,
            proc.returncode,
            time.perf_counter() - started,
            getattr(_LOCAL, "bookkeeping", False),
        )
        with _RECORDERS_LOCK:
            for calls in _RECORDERS:
                calls.append(call)
    return proc


#: Values no git of phasegate's may see whatever their variable's name (a role's
#: ``api_key_env`` need not say KEY): set by ``withhold_from_git``.
_WITHHELD: frozenset[str] = frozenset()


def withhold_from_git(values: Sequence[str]) -> None:
    """Keep every variable holding one of ``values`` out of phasegate's git calls too
    (the engine passes the cartridge's secret values; process-wide, like the
    environment they come from)."""
    global _WITHHELD
    _WITHHELD = _WITHHELD | frozenset(values)


def _git_env() -> dict[str, str]:
    """phasegate's environment without its secrets: whatever git starts
    (a filter or merge driver, an ssh or credential helper from a config phasegate
    does not control) never sees a model key or a forge token — no secret-named
    variable, nor one holding a withheld value. No prompt; English."""
    env = {k: v for k, v in os.environ.items() if not SECRET_NAME.search(k) and v not in _WITHHELD}
    return {**env, "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"}


@contextmanager
def _worktree_admin_lock(cwd: Path | str, timeout_s: float = 120.0) -> Iterator[None]:
    """One ``git worktree`` command at a time per repository, across threads and
    processes (an flock on ``<common>/phasegate/worktrees.lock``, opened anew per
    command). git's own ``worktree prune`` removes another process's entry that a
    ``worktree add`` is still making ("could not open .../gitdir"), so two workers'
    adds and prunes must not interleave. Raises GitTransient after ``timeout_s``."""
    common = common_dir(cwd)
    if common is None:  # not a repository: let the command itself say so
        yield
        return
    with repository_flock(common / "phasegate" / "worktrees.lock", timeout_s):
        yield


def _moves_refs(args: Sequence[str]) -> bool:
    """Whether ``git args`` may move a ref (``REF_MOVING``, less the reading forms
    phasegate uses often: ``branch --list``, ``symbolic-ref [-q] [--short] NAME``)."""
    at, name = _subcommand(args)
    rest = args[at + 1 :]
    if name == "branch":
        return "--list" not in rest
    if name == "symbolic-ref":
        return "-d" in rest or "--delete" in rest or len([a for a in rest if a[:1] != "-"]) > 1
    return name in REF_MOVING


def common_dir(cwd: Path | str) -> Path | None:
    """The git common directory of the repository at ``cwd``, absolute and resolved;
    None when ``cwd`` is in no repository. Read from the checkout's files when
    ``cwd`` is a checkout's top (``phasegate.git.files``), else from git (one
    ``rev-parse``; GitTransient when it keeps failing on a lock)."""
    located = _gitfs.locate(cwd)
    if located is not None:
        return located[1]
    with _bookkeeping():
        found = _run_git(["rev-parse", "--path-format=absolute", "--git-common-dir"], cwd, None)
    return Path(found.stdout.strip()).resolve() if found.returncode == 0 else None


def list_refs(cwd: Path | str) -> dict[str, str]:
    """Every ref of the repository at ``cwd`` (loose and packed): refname → its
    object name, or ``"ref: <target>"`` for a symbolic ref. Read from the ref
    files when they are plain (``phasegate.git.files.read_refs``), else from
    ``git for-each-ref``. Raises GitError (GitTransient when git keeps failing
    on a lock)."""
    located = _gitfs.locate(cwd)
    if located is not None and (refs := _gitfs.read_refs(*located)) is not None:
        return refs
    proc = _run_git(["for-each-ref", "--format=%(refname)%00%(objectname)%00%(symref)"], cwd, None)
    if proc.returncode != 0:
        raise GitError(f"git for-each-ref failed in {cwd}: {proc.stderr.strip()}")
    refs = {}
    for line in proc.stdout.splitlines():
        name, sha, symref = line.split("\0")
        refs[name] = f"ref: {symref}" if symref else sha
    return refs


def own_path(common: Path, name: str) -> Path:
    """``<common>/phasegate/<name>``: where phasegate keeps a file of its own in a
    repository's common git directory; every character of ``name`` but letters,
    digits, ``-``, ``_`` and ``.`` becomes ``-`` (a branch's ``/`` included)."""
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in name)
    return common / "phasegate" / safe


def run_git_unrecorded(
    args: Sequence[str], cwd: Path | str, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``run_git`` without the ref ledger or its lock: for the guard, which holds the
    refs lock exclusively and writes the ledger lines of its restores itself."""
    return _run_git(args, cwd, input)


def run_git(
    args: Sequence[str],
    cwd: Path | str,
    input: str | None = None,
    *,
    env: Mapping[str, str] | None = None,
    attempts: int = TRANSIENT_ATTEMPTS,
) -> subprocess.CompletedProcess[str]:
    """``git args`` in ``cwd``, never prompting, in the C locale (messages phasegate
    reads stay English), with hooks, fsmonitor and signing off (``HARDENED``);
    whatever it exits with, except lock contention. A ref-moving command
    (``REF_MOVING``) records the refs it moved in the ledger.

    A transient failure (see ``is_transient``) is retried up to
    ``attempts`` runs in all (``TRANSIENT_ATTEMPTS``: about 1.5 s at most);
    raises GitTransient, with git's message, when it persists, except with
    ``attempts=1``: the failed run is returned, for a caller that must undo what
    the command left before it runs again (a merge stopped at its ref update).

    ``env`` is added to the environment of this one git process, past
    ``_git_env``'s withholding: how the forge hands git its token (an askpass
    helper's variable) without any other git, or an agent, seeing it.
    """
    if not _moves_refs(args):
        return _run_git(args, cwd, input, env, attempts)
    common = common_dir(cwd)
    if common is None:  # not a repository: let the command itself say so
        return _run_git(args, cwd, input, env, attempts)
    with refs_lock(common, exclusive=False):
        with _bookkeeping():
            before = list_refs(cwd)
        proc = _run_git(args, cwd, input, env, attempts)
        with _bookkeeping(), ledger_turn(common):
            record_refs(common, before, list_refs(cwd))
    return proc


def _run_git(
    args: Sequence[str],
    cwd: Path | str,
    input: str | None,
    env: Mapping[str, str] | None = None,
    attempts: int = TRANSIENT_ATTEMPTS,
) -> subprocess.CompletedProcess[str]:
    delay = _BACKOFF_S
    for attempt in range(1, attempts + 1):
        if args and args[0] == "worktree":
            with _worktree_admin_lock(cwd):
                proc = _run_once(args, cwd, input)
        else:
            proc = _run_once(args, cwd, input, env)
        if not is_transient(proc) or attempts == 1:
            return proc
        if attempt < attempts:
            time.sleep(delay * (1 + random.random()))
            delay *= 2
    raise GitTransient(
        f"git {' '.join(args)} failed in {cwd} {attempts} times: {proc.stderr.strip()}"
    )


def git(
    args: Sequence[str], cwd: Path | str, *, check: bool = True, input: str | None = None
) -> str:
    """Run ``git args`` in ``cwd``; return stdout stripped of its trailing newline.

    Raises GitError (with the command and git's stderr) when ``check`` and git
    fails; GitTransient, check or not, when it keeps failing on a lock.
    """
    proc = run_git(args, cwd, input)
    if check and proc.returncode != 0:
        raise GitError(f"git {' '.join(args)} failed in {cwd}: {proc.stderr.strip()}")
    return proc.stdout.rstrip("\n")
