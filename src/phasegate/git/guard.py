"""Guards on refs and ``.git`` around an agent run.

An agent may change its worktree's files and index, nothing else of git's.
``watch(cwd, key)`` snapshots, before the run:

- every ref of the repository (``git for-each-ref``: heads, tags, remotes,
  ``refs/phasegate``, the stash, loose and packed) and the ledger's size
  (``phasegate.git.command``: what phasegate itself moves meanwhile is not the agent's);
- the agent's worktree's ``HEAD`` and the person's checkout's (never another
  workflow's worktree: its worker adds and removes those meanwhile);
- the files that can change what git runs or sees: the common ``config`` and
  ``config.worktree``, the global and system config phasegate's git reads
  (``GIT_CONFIG_GLOBAL``, ``~/.gitconfig``, the XDG one, ``/etc/gitconfig``)
  and every file they ``include``, the agent's worktree git dir's
  ``config.worktree``, ``commondir`` and ``gitdir`` and its ``.git`` file,
  everything under ``hooks/``, ``info/`` and an absolute ``core.hooksPath``,
  ``objects/info/alternates`` and the stash's reflog.

After the run (or when the block raises), under the refs lock held
exclusively: a ref that differs from its snapshot and from the last value
the ledger says phasegate gave it is put back (one the agent created is
deleted), a changed ``HEAD`` is put back, and when the agent's own HEAD or
branch moved its index is reset to the restored HEAD, keeping its working
tree; changed files are rewritten (mode and symlinks too), new files in the
watched directories removed. Each kind found is one Violation:
``ref_violation`` (refs and HEADs) and ``git_dir_violation`` (files). The
person's index and working tree are never touched: a commit an agent made in
their checkout leaves its content staged there, visible, uncommitted.

Crash safety: the snapshot is journaled before the agent starts (to
``<common>/phasegate/guard-<key>.json``) and removed after the check; the
engine's reconciliation (``SideEffects.reconcile``, after it stopped the
orphaned agent) and the next ``watch`` of the same key restore from a journal
a killed phasegate left.

A confined run (``own_only``: the agent ran under bubblewrap, where the git
directory, the person's home and the system are read-only to it) is watched
for what it can reach only: its worktree's ``.git`` file (in its writable
worktree: pointed elsewhere, it would hand phasegate's git a config of the
agent's), its worktree git dir's files and its branch. Everything else
cannot be the agent's then, so a person who commits, checks out or edits
their git config or hooks meanwhile keeps what they did.

Not told apart in an unconfined run (``sandbox = "none"``): ref moves by a
person during it (they are undone like the agent's; the violation names both
values, and git's reflog keeps the commit), and two agents' runs overlapping
in one repository (one may be blamed for the other's move; both are undone).
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar

from phasegate.core.contract import Violation
from phasegate.git import files as _gitfs
from phasegate.git.command import (
    LEDGER,
    common_dir,
    list_refs,
    own_path,
    read_ledger,
    record_refs,
    refs_lock,
    run_git_unrecorded,
)

__all__ = [
    "CONFIG_FILE_VARIABLES",
    "Guarded",
    "Snapshot",
    "Watch",
    "included_configs",
    "recover",
    "restore",
    "snapshot",
    "user_configs",
    "watch",
]

#: A watched file's state: ("file", base64 bytes, mode), ("link", target, 0) or absent.
FileState = tuple[str, str, int]

#: Directories under the common git dir whose every file is watched.
_WATCHED_DIRS = ("hooks", "info")

#: The most files read from one watched directory (a hooksPath may be anything).
_MAX_FILES = 2000


@dataclass(frozen=True)
class Snapshot:
    """What an agent run must leave as it was (this module's docstring).

    ``refs``: refname → object name or ``"ref: target"``; ``files``: absolute
    path → FileState; ``dirs``: directories whose new files are removed;
    ``gitdir``/``branch``: the worktree's own git dir and branch ("" when
    detached); ``ledger``: the ref ledger's size in bytes when taken;
    ``own_only``: a confined run's snapshot, of its own branch and HEAD only
    (the module's docstring)."""

    cwd: str
    common: str
    gitdir: str
    branch: str
    refs: dict[str, str]
    files: dict[str, FileState | None]
    dirs: tuple[str, ...]
    ledger: int
    role: str = ""
    phase: str = ""
    own_only: bool = False

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Snapshot:
        data = json.loads(text)
        data["dirs"] = tuple(data["dirs"])
        data["files"] = {k: tuple(v) if v else None for k, v in data["files"].items()}
        return cls(**data)


def _git_out(args: list[str], cwd: Path | str) -> str | None:
    proc = run_git_unrecorded(args, cwd)
    return proc.stdout.strip() if proc.returncode == 0 else None


def _locate(cwd: Path) -> tuple[Path, Path, str] | None:
    """(git dir, common dir, the branch HEAD names or "") of the checkout at ``cwd``:
    read from its files (``phasegate.git.files``), else asked of git; None outside git."""
    located = _gitfs.locate(cwd)
    head = _gitfs.head(located[0]) if located is not None else None
    if located is not None and head is not None:
        branch = head[5:] if head.startswith("ref: ") else ""
        return located[0], located[1], branch
    common_s = _git_out(["rev-parse", "--path-format=absolute", "--git-common-dir"], cwd)
    gitdir_s = _git_out(["rev-parse", "--path-format=absolute", "--git-dir"], cwd)
    if not common_s or not gitdir_s:
        return None
    branch = _git_out(["symbolic-ref", "-q", "HEAD"], cwd) or ""
    return Path(gitdir_s).resolve(), Path(common_s).resolve(), branch


def _read(path: Path) -> FileState | None:
    try:
        info = path.lstat()
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(info.st_mode):
        return ("link", os.readlink(path), 0)
    if not stat.S_ISREG(info.st_mode):
        return ("other", "", 0)
    return ("file", base64.b64encode(path.read_bytes()).decode(), stat.S_IMODE(info.st_mode))


def _files_under(root: Path) -> list[Path]:
    found: list[Path] = []
    if not root.is_dir() or root.is_symlink():
        return found
    for dirpath, _dirs, names in os.walk(root):
        found += [Path(dirpath) / name for name in names]
        if len(found) >= _MAX_FILES:
            break
    return sorted(found[:_MAX_FILES])


def _gitdirs(common: Path) -> list[Path]:
    """The common dir (the main checkout's git dir) and every linked worktree's."""
    linked = common / "worktrees"
    return (
        [common, *sorted(p for p in linked.iterdir() if p.is_dir())]
        if linked.is_dir()
        else [common]
    )


def user_configs() -> list[Path]:
    """The global and system git config files phasegate's own git reads (an
    unconfined agent sharing the person's HOME, or run as root, could plant an
    ``sshCommand``, an fsmonitor or a filter there)."""
    found: list[Path] = []
    if os.environ.get("GIT_CONFIG_GLOBAL"):
        found.append(Path(os.environ["GIT_CONFIG_GLOBAL"]))
    else:
        xdg = os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
        found += [Path(os.path.expanduser("~/.gitconfig")), Path(xdg) / "git" / "config"]
    # Watched under GIT_CONFIG_NOSYSTEM too: the person's own git may read it.
    found.append(Path(os.environ.get("GIT_CONFIG_SYSTEM") or "/etc/gitconfig"))
    return found


_SECTION = re.compile(r"^\s*\[\s*([^\]\s\"]+)")
_INCLUDE_PATH = re.compile(r"^\s*path\s*=\s*\"?(.*?)\"?\s*$", re.IGNORECASE)


def included_configs(configs: list[Path], depth: int = 5) -> list[Path]:
    """``configs`` and every file their ``[include]``/``[includeIf]`` sections name,
    followed ``depth`` levels: an agent may plant its settings in an included file."""
    found, todo = list(configs), list(configs)
    for _ in range(depth):
        more: list[Path] = []
        for config in todo:
            try:
                lines = config.read_text(errors="replace").splitlines()
            except OSError:
                continue
            section = ""
            for line in lines:
                if header := _SECTION.match(line):
                    section = header.group(1).lower()
                elif section in ("include", "includeif") and (path := _INCLUDE_PATH.match(line)):
                    target = Path(os.path.expanduser(path.group(1)))
                    target = target if target.is_absolute() else config.parent / target
                    if target not in found:
                        found.append(target)
                        more.append(target)
        todo = more
    return found


def _hooks_paths(cwd: Path, configs: list[Path]) -> list[str]:
    """Every ``core.hooksPath`` git reads at ``cwd``; asked of git only when one of
    ``configs`` (every file a setting could come from, includes followed) names
    the key or an include at all, or the environment passes settings (``GIT_CONFIG_*``):
    otherwise there is none, and the answer costs no git."""
    environment = any(
        k.startswith("GIT_CONFIG_") and k not in CONFIG_FILE_VARIABLES for k in os.environ
    )
    named = False
    for config in configs:
        try:
            text = config.read_bytes().lower()
        except OSError:
            continue  # absent (most are): no setting there
        # an include this module might not follow as git does (a condition, a ~user): ask git
        named = named or b"hookspath" in text or b"include" in text
    if not named and not environment:
        return []
    return (_git_out(["config", "--get-all", "core.hooksPath"], cwd) or "").splitlines()


#: ``GIT_CONFIG_*`` variables that name a file (watched in ``user_configs``), not a setting.
CONFIG_FILE_VARIABLES = frozenset({"GIT_CONFIG_GLOBAL", "GIT_CONFIG_SYSTEM", "GIT_CONFIG_NOSYSTEM"})


def _watched(
    cwd: Path, common: Path, gitdir: Path, own_only: bool
) -> tuple[list[Path], list[Path]]:
    """The files and directories a snapshot keeps (this module's docstring).

    Never another workflow's worktree git dir: its worker adds and removes it
    meanwhile, and a snapshot caught half-made must not be put back."""
    files = [cwd / ".git"]
    if gitdir != common:
        files += [gitdir / "HEAD", gitdir / "config.worktree", gitdir / "commondir"]
        files.append(gitdir / "gitdir")
    if own_only:
        return files, []
    files += [common / "HEAD", common / "logs" / "refs" / "stash"]
    files.append(common / "objects" / "info" / "alternates")
    configs = included_configs([common / "config", common / "config.worktree", *user_configs()])
    files += configs
    dirs = [common / name for name in _WATCHED_DIRS]
    for value in _hooks_paths(cwd, [*configs, gitdir / "config.worktree"]):
        hooks = Path(os.path.expanduser(value.strip()))
        if hooks.is_absolute() and hooks != Path("/dev/null"):
            dirs.append(hooks)
    for directory in dirs:
        files += _files_under(directory)
    return sorted(set(files)), dirs


def snapshot(
    cwd: Path, *, role: str = "", phase: str = "", own_only: bool = False
) -> Snapshot | None:
    """The snapshot of the repository ``cwd`` is in, or None outside git; with
    ``own_only`` of a confined run's own branch, HEAD and the repository's git
    files (the module's docstring). Taken under the refs lock held exclusively
    (GitTransient after its timeout)."""
    located = _locate(cwd)
    if located is None:
        return None
    gitdir, common, branch = located
    with refs_lock(common, exclusive=True):
        refs = list_refs(cwd)
        ledger = (common / LEDGER).stat().st_size if (common / LEDGER).exists() else 0
    files, dirs = _watched(cwd, common, gitdir, own_only)
    if own_only:
        # Its own branch, in a worktree of its own; in the person's checkout (the
        # graph's roles run there) the branch is the person's, and theirs to move.
        refs = {name: value for name, value in refs.items() if name == branch and gitdir != common}
    return Snapshot(
        cwd=str(cwd),
        common=str(common),
        gitdir=str(gitdir),
        branch=branch,
        refs=refs,
        files={str(p): _read(p) for p in files},
        dirs=tuple(str(d) for d in dirs),
        ledger=ledger,
        role=role,
        phase=phase,
        own_only=own_only,
    )


def _write(path: Path, state: FileState | None) -> None:
    """Put ``state`` back at ``path`` (atomically for a file; None removes it)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)  # what the agent put in the way of a file git reads
    if state is None or state[0] == "other":
        if state is None and (path.exists() or path.is_symlink()):
            path.unlink()
        return
    tmp = path.with_name(f".{path.name}.phasegate-restore")
    if tmp.exists() or tmp.is_symlink():
        tmp.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    kind, content, mode = state
    if kind == "link":
        os.symlink(content, tmp)
    else:
        tmp.write_bytes(base64.b64decode(content))
        tmp.chmod(mode)
    os.replace(tmp, path)


def _short(value: str | None) -> str:
    if not value:
        return "(none)"
    return value if value.startswith("ref: ") else value[:12]


def _restore_refs(snap: Snapshot, common: Path) -> tuple[list[str], list[str]]:
    """Refs back to the snapshot or to phasegate's own later value; (refnames, notes)."""
    # Listed and written where the snapshot listed them: per-worktree refs
    # (refs/bisect, refs/worktree) are the worktree's own.
    where = Path(snap.cwd) if Path(snap.cwd).is_dir() else common
    now = list_refs(where)
    moved, _size = read_ledger(common, snap.ledger)
    names, notes, stdin = [], [], []
    after = dict(now)
    # A confined run's snapshot holds its own branch only: every other ref is not its to undo.
    for name in sorted(snap.refs.keys() if snap.own_only else snap.refs.keys() | now.keys()):
        want = moved[name] if name in moved else snap.refs.get(name, "")
        have = now.get(name, "")
        if have == want:
            continue
        names.append(name)
        notes.append(f"{name} {_short(want)} ← {_short(have)}")
        if not want:
            stdin.append(f"delete {name}\n")
            after.pop(name, None)
        elif want.startswith("ref: "):
            run_git_unrecorded(["symbolic-ref", name, want[5:]], where)
            after[name] = want
        else:
            stdin.append(f"update {name} {want}\n")
            after[name] = want
    if stdin:
        proc = run_git_unrecorded(["update-ref", "--no-deref", "--stdin"], where, "".join(stdin))
        if proc.returncode != 0:
            notes.append(f"(git update-ref failed: {proc.stderr.strip()[:300]})")
    record_refs(common, now, after)  # other runs' guards must see these as phasegate's
    return names, notes


def restore(snap: Snapshot) -> list[Violation]:
    """Compare the repository with ``snap`` and undo what differs (this module's
    docstring); the violations found, ``ref_violation`` first. Raises
    GitTransient when the refs lock stays held, OSError when a file cannot be
    written back."""
    common, cwd = Path(snap.common), Path(snap.cwd)
    violations: list[Violation] = []
    with refs_lock(common, exclusive=True):
        names, notes = _restore_refs(snap, common)
        heads: list[str] = []
        changed: list[str] = []
        for path_s, state in snap.files.items():
            path = Path(path_s)
            if _read(path) == state:
                continue
            in_worktree = path.parent.parent == common / "worktrees" or path == cwd / ".git"
            if in_worktree and not path.parent.is_dir():
                continue  # that worktree was removed meanwhile: nothing to put back in it
            _write(path, state)
            (heads if path.name == "HEAD" and path.parent in _gitdirs(common) else changed).append(
                path_s
            )
        for directory in snap.dirs:
            for path in _files_under(Path(directory)):
                if str(path) not in snap.files:
                    path.unlink()
                    changed.append(str(path))
    own_moved = any(Path(h).parent == Path(snap.gitdir) for h in heads) or snap.branch in names
    if own_moved and cwd.is_dir():
        # The index the agent left belongs to the commit it moved to: match it to the
        # restored HEAD, keeping the working tree (the attempt fails; its edits are visible).
        run_git_unrecorded(["reset", "-q"], cwd)
    if names or heads:
        moved = names + [f"HEAD of {Path(h).parent}" for h in heads]
        detail = f"the agent moved {len(moved)} ref(s), restored: " + "; ".join(
            notes + [f"HEAD of {Path(h).parent}" for h in heads]
        )
        violations.append(Violation("ref_violation", detail[:2000], tuple(moved)))
    if changed:
        shown = [_relative(p, common) for p in changed]
        detail = f"the agent changed {len(shown)} file(s) of the git directory, restored: "
        violations.append(
            Violation("git_dir_violation", (detail + ", ".join(shown[:10]))[:2000], tuple(shown))
        )
    return violations


def _relative(path: str, common: Path) -> str:
    try:
        return str(Path(path).relative_to(common))
    except ValueError:
        return path


def _journal_path(common: Path, key: str) -> Path:
    # a file, not a directory: directories in <common>/phasegate are checkouts
    return own_path(common, f"guard-{key}.json")


def recover(cwd: Path, key: str) -> list[tuple[str, str, Violation]]:
    """Restore from the journal a killed phasegate left for ``key`` (a run never
    checked); (role, phase, violation) for each found. [] when there is none
    (or ``cwd`` is no directory in a repository)."""
    if not Path(cwd).is_dir():
        return []
    common = common_dir(cwd)
    if common is None:
        return []
    journal = _journal_path(common, key)
    if not journal.is_file():
        return []
    try:
        snap = Snapshot.from_json(journal.read_text())
    except (ValueError, TypeError, KeyError):
        journal.unlink()  # cut by the kill before the agent started: nothing to check
        return []
    found = [(snap.role, snap.phase, v) for v in restore(snap)]
    journal.unlink()
    return found


class Guarded(Protocol):
    """An agent run's result as ``Watch.apply`` reads it (``agents.base.AgentResult``,
    a frozen dataclass): the guard sits below the agents, so it names only this."""

    __dataclass_fields__: ClassVar[dict[str, Any]]

    @property
    def ok(self) -> bool: ...

    @property
    def error(self) -> str | None: ...

    @property
    def violations(self) -> tuple[Violation, ...]: ...


R = TypeVar("R", bound=Guarded)


@dataclass
class Watch:
    """One guarded run: the violations found after it (``found``), and those
    restored from a killed run's journal before it (``recovered``)."""

    found: list[Violation] = field(default_factory=list)
    recovered: list[tuple[str, str, Violation]] = field(default_factory=list)

    def apply(self, result: R) -> R:
        """``result`` failed with the first violation found (its name as error
        kind), every one added to its violations; as it is when none."""
        if not self.found:
            return result
        first = self.found[0]
        error = first.detail if result.ok else f"{first.detail} (and: {result.error})"
        return replace(
            result,
            error_kind=first.name,
            error=error,
            violations=(*result.violations, *self.found),
        )


@contextmanager
def watch(
    cwd: Path, key: str, *, role: str = "", phase: str = "", confined: bool = False
) -> Iterator[Watch]:
    """Guard the agent run in the block (this module's docstring). ``key`` names
    the journal (the workflow or graph run: one agent at a time each); a
    ``confined`` run is watched for its own branch and HEAD only. Nothing is
    guarded outside git."""
    seen = Watch(recovered=recover(cwd, key))
    snap = snapshot(cwd, role=role, phase=phase, own_only=confined)
    if snap is None:
        yield seen
        return
    journal = _journal_path(Path(snap.common), key)
    journal.parent.mkdir(parents=True, exist_ok=True)
    tmp = journal.with_suffix(".tmp")
    tmp.write_text(snap.to_json())
    os.replace(tmp, journal)
    try:
        yield seen
    finally:
        # Gone: a worker that took the workflow over restored from it (its
        # reconciliation) and owns the repository's state now; undo nothing twice.
        if journal.exists():
            seen.found = restore(snap)
            journal.unlink(missing_ok=True)
