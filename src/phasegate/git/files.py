"""Reading git's own files without starting a git, so asking costs no process.

A git process costs milliseconds; a lifecycle asked git hundreds of times
what its files say outright: where a checkout's git dir and common dir are,
what HEAD names, which refs exist (the ref ledger listed every ref twice per
ref move, the guard twice per agent run), which worktree registrations are
stale. This module reads those files for the ``files`` ref backend git
writes by default, and answers None whenever what it finds is anything but
the plain case — a reftable repository, ``GIT_DIR`` and friends in the
environment, a loose ref it cannot parse, a name git would not accept — so
the caller asks git itself (``phasegate.git.command``). Nothing is cached: every
answer is read afresh, so one workflow's thread never sees another's stale.

The ref listing equals ``git for-each-ref --format=%(refname)%00%(objectname)
%00%(symref)`` as ``phasegate.git.command.list_refs`` keeps it (refname → object name,
or ``"ref: <target>"``): loose refs over packed ones, a linked worktree's own
per-worktree refs (``refs/bisect``, ``refs/worktree``, ``refs/rewritten``)
instead of the main checkout's, a symbolic ref whose target does not resolve
left out as git leaves it out. One difference, on purpose: a ref naming an
object the repository lacks is listed (git skips it as broken), which only
makes the guard stricter.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "Registration",
    "head",
    "locate",
    "branch_name_is_plain",
    "merge_head",
    "read_refs",
    "registrations",
    "resolve",
]

# Variables that make git look elsewhere than a checkout's .git: then only git knows.
_REDIRECTING = ("GIT_DIR", "GIT_COMMON_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_NAMESPACE")

#: Per-worktree ref namespaces (git's refs.c ``is_per_worktree_ref``).
_PER_WORKTREE = ("refs/bisect/", "refs/worktree/", "refs/rewritten/")

_OBJECT = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")
# A conservative subset of check-ref-format: anything else, git is asked.
_COMPONENT = re.compile(r"^[A-Za-z0-9_+=@,-][A-Za-z0-9_+=@,.-]*$")


def _redirected() -> bool:
    return any(os.environ.get(name) for name in _REDIRECTING)


def locate(cwd: Path | str) -> tuple[Path, Path] | None:
    """(git dir, common dir) of the checkout whose top is ``cwd``, both resolved,
    read from its ``.git`` (a directory, or a file ``gitdir: <path>`` with a
    ``commondir`` beside the git dir's HEAD); None when ``cwd`` is not a
    checkout's top or git's environment points elsewhere (ask git)."""
    if _redirected():
        return None
    dot_git = Path(cwd) / ".git"
    try:
        if dot_git.is_dir():
            gitdir = dot_git.resolve()
        elif dot_git.is_file():
            text = dot_git.read_text(errors="replace").strip()
            if not text.startswith("gitdir: ") or "\n" in text:
                return None
            gitdir = (Path(cwd) / text.removeprefix("gitdir: ")).resolve()
        else:
            return None
        if not (gitdir / "HEAD").is_file():
            return None
        commondir = gitdir / "commondir"
        if commondir.is_file():
            common = (gitdir / commondir.read_text(errors="replace").strip()).resolve()
        else:
            common = gitdir
        if not (common / "refs").is_dir() or (common / "reftable").exists():
            return None
    except OSError:
        return None
    return gitdir, common


def head(gitdir: Path) -> str | None:
    """What ``gitdir/HEAD`` says: ``"ref: <refname>"`` or an object name; None when
    it reads as neither (ask git)."""
    try:
        text = (gitdir / "HEAD").read_text(errors="replace").strip()
    except OSError:
        return None
    if text.startswith("ref: ") and _valid_name(text[5:]):
        return text
    return text if _OBJECT.match(text) else None


def _valid_name(name: str) -> bool:
    parts = name.split("/")
    return (
        len(parts) >= 2
        and parts[0] == "refs"
        and all(_COMPONENT.match(p) and not p.endswith(".lock") for p in parts)
        and ".." not in name
        and "@{" not in name
    )


def _loose(
    root: Path, include: tuple[str, ...] | None, exclude: tuple[str, ...]
) -> dict[str, str] | None:
    """Loose refs under ``root/refs``: refname → its file's content; None when one
    is no ref git would read as one."""
    found: dict[str, str] = {}
    base = root / "refs"
    for dirpath, dirnames, names in os.walk(base):
        dirnames.sort()
        rel = Path(dirpath).relative_to(root).as_posix()
        for name in names:
            if name.endswith(".lock"):
                continue  # a ref being written: git skips it too
            refname = f"{rel}/{name}"
            if include is not None and not refname.startswith(include):
                continue
            if refname.startswith(exclude):
                continue
            if not _valid_name(refname):
                return None
            if (Path(dirpath) / name).is_symlink():
                return None  # a symbolic ref of the old kind: git reads it as one
            try:
                content = (Path(dirpath) / name).read_text(errors="replace").strip()
            except FileNotFoundError:
                continue  # deleted (or packed) meanwhile: packed-refs is read after
            except OSError:
                return None
            if not (_OBJECT.match(content) or (content.startswith("ref: ") and content[5:])):
                return None
            found[refname] = content
    return found


def _packed(common: Path) -> dict[str, str] | None:
    try:
        text = (common / "packed-refs").read_text(errors="replace")
    except FileNotFoundError:
        return {}
    except OSError:
        return None
    found: dict[str, str] = {}
    for line in text.splitlines():
        if not line or line.startswith(("#", "^")):
            continue  # the header, and peeled values of tags
        sha, _, name = line.partition(" ")
        if not _OBJECT.match(sha) or not _valid_name(name):
            return None
        found[name] = sha
    return found


def read_refs(gitdir: Path, common: Path) -> dict[str, str] | None:
    """Every ref a git in the checkout of ``gitdir`` lists (this module's docstring):
    refname → object name or ``"ref: <target>"``; None when only git can say.

    Loose refs are read before ``packed-refs``: a ``pack-refs`` running meanwhile
    writes the packed file before it deletes the loose one, so no ref is missed."""
    linked = gitdir != common
    shared = _loose(common, None, _PER_WORKTREE if linked else ())
    own = _loose(gitdir, _PER_WORKTREE, ()) if linked else {}
    packed = _packed(common)
    if shared is None or own is None or packed is None:
        return None
    if linked:
        packed = {k: v for k, v in packed.items() if not k.startswith(_PER_WORKTREE)}
    raw = {**packed, **shared, **own}
    refs: dict[str, str] = {}
    for name, value in raw.items():
        if not value.startswith("ref: "):
            refs[name] = value
            continue
        target, seen = value[5:], {name}
        while target in raw and raw[target].startswith("ref: ") and target not in seen:
            seen.add(target)
            target = raw[target][5:]
        if target in raw and not raw[target].startswith("ref: "):
            refs[name] = value  # (a dangling or looping one git leaves out)
    return dict(sorted(refs.items()))


def resolve(cwd: Path | str, name: str) -> str | None:
    """The object ``name`` names in the checkout at ``cwd``, as ``git rev-parse
    --verify <name>`` finds it, for ``HEAD`` and a plain branch name only; None
    when this module cannot say (another kind of name, a ref of another kind
    shadowing the branch in git's lookup order, files not plain): ask git.
    A branch is taken to name a commit, as every git command that moves one
    makes it."""
    located = locate(cwd)
    refs = read_refs(*located) if located is not None else None
    if located is None or refs is None:
        return None
    gitdir, common = located
    if name == "HEAD":
        value = head(gitdir)
        if value is not None and value.startswith("ref: "):
            value = refs.get(value[5:])
        return value if value is not None and _OBJECT.match(value) else None
    if not _valid_name(f"refs/heads/{name}") or name.startswith("refs/"):
        return None
    # rev-parse tries <gitdir>/<name>, refs/<name> and refs/tags/<name> before refs/heads/<name>
    try:
        shadowed = (gitdir / name).exists() or (common / name).exists()
    except OSError:
        return None
    if shadowed or f"refs/{name}" in refs or f"refs/tags/{name}" in refs:
        return None
    value = refs.get(f"refs/heads/{name}")
    return value if value is not None and _OBJECT.match(value) else None


def branch_name_is_plain(name: str) -> bool:
    """Whether ``name`` is a branch name this module reads (no glob, no odd character)."""
    return _valid_name(f"refs/heads/{name}")


def merge_head(cwd: Path | str) -> bool | None:
    """Whether the checkout at ``cwd`` has a merge in progress (a ``MERGE_HEAD``
    naming an object); None when this module cannot say."""
    located = locate(cwd)
    if located is None:
        return None
    try:
        text = (located[0] / "MERGE_HEAD").read_text(errors="replace")
    except FileNotFoundError:
        return False
    except OSError:
        return None
    first = text.split("\n", 1)[0].strip()
    return True if _OBJECT.match(first) else None


@dataclass(frozen=True)
class Registration:
    """One ``<common>/worktrees/<id>``: its worktree's directory (None when its
    ``gitdir`` file is missing or unreadable), the lock's reason (None when not
    locked) and whether ``git worktree prune`` would remove it."""

    admin: Path
    path: Path | None
    locked: str | None
    prunable: bool


def registrations(common: Path) -> list[Registration]:
    """The linked worktrees ``common`` registers, read from its ``worktrees/``
    directory (git's own rule for prunable: no ``gitdir`` file, or one naming a
    ``.git`` that is gone, and not locked)."""
    found: list[Registration] = []
    admin_root = common / "worktrees"
    try:
        admins = sorted(p for p in admin_root.iterdir() if p.is_dir())
    except (FileNotFoundError, NotADirectoryError):  # git removes it with the last worktree
        return found
    for admin in admins:
        try:
            locked: str | None = (admin / "locked").read_text(errors="replace").strip()
        except FileNotFoundError:
            locked = None
        except OSError:
            locked = ""
        try:
            dot_git = Path((admin / "gitdir").read_text(errors="replace").strip())
            path: Path | None = dot_git.parent.resolve() if dot_git.is_absolute() else None
        except OSError:
            dot_git, path = None, None
        gone = dot_git is None or path is None or not dot_git.exists()
        found.append(Registration(admin, path, locked, gone and locked is None))
    return found
