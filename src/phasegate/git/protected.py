"""Protected paths: the files whose change by an agent waits for a person, whatever the profile.

The rules a team sets live in files of its repository: the cartridge, its CI
configuration and the files its checks run. An agent that changed them could
lower the bar for every later change (a role's sandbox off, a check that always
passes), so a change touching one never merges unattended (docs/trust.md).

Pure module: the tracked files and the cartridge's settings come in, patterns
and matches go out.

- ``DEFAULT_PROTECTED_PATHS``: ``[workflow] protected_paths`` when the cartridge
  names none.
- ``check_files``: the files of a change that a check command names or that
  the tool it runs reads (a Makefile, package.json).
- ``protected_patterns``: the cartridge file, the configured paths and the
  check files, as patterns of ``graph.facts.path_matches``.
- ``protected_touched``: the paths of a change that match one of them.
- ``links_out``: whether a symbolic link's target leaves the repository.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Collection, Iterable, Sequence
from fnmatch import fnmatchcase
from pathlib import PurePosixPath

from phasegate.graph.facts import path_matches

__all__ = [
    "CARTRIDGE_PATH",
    "DEFAULT_PROTECTED_PATHS",
    "check_files",
    "links_out",
    "protected_patterns",
    "protected_touched",
]

#: The cartridge's path in the repository, protected whatever the cartridge says.
CARTRIDGE_PATH = "phasegate.toml"

#: What ``[workflow] protected_paths`` is when not given: the cartridge and the CI
#: configuration of GitHub, GitLab and a repository's own ``.ci/``. A path ending in
#: ``/`` protects everything under it; other entries are paths or globs.
DEFAULT_PROTECTED_PATHS: tuple[str, ...] = (CARTRIDGE_PATH, ".github/", ".gitlab-ci.yml", ".ci/")

#: The files that say what a check command runs when the command names only its tool:
#: ``make test`` runs the Makefile's recipe, ``npm test`` package.json's script, and
#: pytest reads its options (``addopts``, ``testpaths``) from any of its config files.
_TOOL_FILES: dict[str, tuple[str, ...]] = {
    "make": ("Makefile", "makefile", "GNUmakefile"),
    "npm": ("package.json",),
    "pnpm": ("package.json",),
    "yarn": ("package.json",),
    "tox": ("tox.ini",),
    "nox": ("noxfile.py",),
    "just": ("justfile", "Justfile", ".justfile"),
    "pytest": ("pytest.ini", "pyproject.toml", "setup.cfg", "tox.ini"),
}

#: Files a tool reads wherever they are in the tree: pytest's conftest.py can skip any test.
_TOOL_FILES_ANYWHERE: dict[str, tuple[str, ...]] = {"pytest": ("conftest.py",)}

#: The options that move a tool into another directory, whose own files it then reads.
_DIRECTORY_OPTIONS = frozenset({"-C", "--directory", "--prefix", "--cwd", "--dir"})

#: The shell's own words for where the checkout is.
_CHECKOUT_WORDS = ("$PWD/", "${PWD}/")

_GLOB = re.compile(r"[*?[]")


def _words(command: str) -> list[str]:
    """The words of ``command`` as the shell splits them (``a>b`` and ``x;y`` are
    three words each), and the words of each word that is itself a command line
    (``sh -c '...'``)."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        words = list(lexer)
    except ValueError:  # an unbalanced quote: the shell will refuse it anyway
        words = command.split()
    inner = [w for word in words if " " in word.strip() for w in _words(word)]
    return words + inner


def _relative(word: str, roots: Sequence[str]) -> str | None:
    """``word`` as a path relative to the checkout: ``./`` and ``$PWD/`` dropped, an
    absolute path under one of ``roots`` made relative; None for a path outside."""
    for prefix in _CHECKOUT_WORDS:
        word = word.removeprefix(prefix)
    if word.startswith("/"):
        for root in roots:
            if word.startswith(root.rstrip("/") + "/"):
                word = word[len(root.rstrip("/")) + 1 :]
                break
        else:
            return None
    path = posixpath.normpath(word)
    return None if path == ".." or path.startswith("../") else path


def check_files(
    checks: Sequence[str],
    paths: Collection[str],
    roots: Sequence[str] = (),
    tracked: Collection[str] | None = None,
) -> tuple[str, ...]:
    """The ``paths`` (a change's, repository-relative) that the check commands run
    or name, sorted. A path a command names counts when it is ``tracked`` too
    (the change's paths the base has; None: all of ``paths``): a file the
    change adds is the change's own. A tool's own file counts, added or not: a
    new conftest.py can skip every test.

    A command's words are read as the shell splits them, and so are the words of
    a command line inside one (``sh -c '...'``). A word counts, as does the value
    after ``=`` in ``NAME=value`` or ``--option=value``, when it is one of
    ``paths`` once normalized: ``./``, ``//`` and ``..`` resolved, ``$PWD/``
    dropped, an absolute path under one of ``roots`` (the checkout, the
    worktree) made relative, each also taken from every directory a ``cd``,
    ``-C``, ``--prefix`` or ``--cwd`` names. A word with a glob counts every
    path it matches. ``python -m a.b`` counts ``a/b.py`` and the package's
    ``__init__.py`` and ``__main__.py``. A tool that reads a file of its own
    counts that file in each such directory: ``make`` its Makefile, ``npm``,
    ``pnpm`` and ``yarn`` package.json, ``tox`` tox.ini, ``nox`` noxfile.py,
    ``just`` its justfile, ``pytest`` pytest.ini, pyproject.toml, setup.cfg,
    tox.ini and every conftest.py.

    What a check reaches another way (a variable, a Makefile's ``include``, a
    script that runs a directory of scripts, a symbolic link's target) is not
    seen: name it in ``[workflow] protected_paths``.
    """
    found: set[str] = set()
    named: set[str] = set()
    for command in checks:
        words = _words(command)
        dirs = [""]
        tools: set[str] = set()
        for index, word in enumerate(words):
            previous = words[index - 1] if index else ""
            option, _, value = word.partition("=")
            if previous in ("cd", "pushd", *_DIRECTORY_OPTIONS) or option in _DIRECTORY_OPTIONS:
                where = _relative(value if option in _DIRECTORY_OPTIONS else word, roots)
                if where is not None and where not in dirs:
                    dirs.append(where)
            candidates = {word, value}
            if previous == "-m":  # python -m a.b
                module = word.replace(".", "/")
                candidates |= {f"{module}.py", f"{module}/__init__.py", f"{module}/__main__.py"}
            for candidate in candidates:
                for where in dirs:
                    path = _relative(posixpath.join(where, candidate), roots)
                    if path is None or path == ".":
                        continue
                    if _GLOB.search(path):
                        named.update(p for p in paths if fnmatchcase(p, path))
                    elif path in paths:
                        named.add(path)
            tools.add(word.rsplit("/", 1)[-1])
        # After the whole command: `make -C sub test` names its directory after its tool.
        for tool in tools:
            for name in _TOOL_FILES.get(tool, ()):
                found.update(posixpath.join(where, name) for where in dirs)
            for name in _TOOL_FILES_ANYWHERE.get(tool, ()):
                found.update(p for p in paths if posixpath.basename(p) == name)
    named &= set(paths if tracked is None else tracked)
    return tuple(sorted(p for p in found | named if p in paths))


def links_out(path: str, target: str) -> bool:
    """Whether a symbolic link at ``path`` (repository-relative) whose target is
    ``target`` points out of the repository: an absolute target, or one whose
    ``..`` climb past the repository's root."""
    if target.startswith("/"):
        return True
    depth = 0
    for part in (PurePosixPath(path).parent / target).parts:
        depth += -1 if part == ".." else 0 if part == "." else 1
        if depth < 0:
            return True
    return False


def protected_patterns(
    configured: Sequence[str] | None,
    checks: Sequence[str],
    paths: Collection[str],
    roots: Sequence[str] = (),
    tracked: Collection[str] | None = None,
) -> tuple[str, ...]:
    """Every protected pattern for a change of ``paths``: the cartridge file,
    ``configured`` (None: the default list; a leading ``./`` dropped) and
    ``check_files(checks, paths, roots, tracked)``; in that order, once each."""
    given = DEFAULT_PROTECTED_PATHS if configured is None else tuple(configured)
    given = tuple(p.removeprefix("./") for p in given)
    patterns = (CARTRIDGE_PATH, *given, *check_files(checks, paths, roots, tracked))
    return tuple(dict.fromkeys(patterns))


def protected_touched(paths: Iterable[str], patterns: Sequence[str]) -> tuple[str, ...]:
    """The ``paths`` that match a protected pattern, sorted, each once."""
    return tuple(sorted({p for p in paths if any(path_matches(p, pat) for pat in patterns)}))
