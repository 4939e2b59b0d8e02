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

import shlex
from collections.abc import Collection, Iterable, Sequence
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
#: ``make test`` runs the Makefile's recipe, ``npm test`` package.json's script.
_TOOL_FILES: dict[str, tuple[str, ...]] = {
    "make": ("Makefile", "makefile", "GNUmakefile"),
    "npm": ("package.json",),
    "pnpm": ("package.json",),
    "yarn": ("package.json",),
    "tox": ("tox.ini",),
    "nox": ("noxfile.py",),
    "just": ("justfile", "Justfile", ".justfile"),
    "pytest": ("pytest.ini",),
}


def _words(command: str) -> list[str]:
    """The words of ``command`` as the shell splits them, and the words of each
    word that is itself a command line (``sh -c '...'``)."""
    try:
        words = shlex.split(command)
    except ValueError:  # an unbalanced quote: the shell will refuse it anyway
        words = command.split()
    inner = [w for word in words if " " in word.strip() for w in _words(word)]
    return words + inner


def check_files(checks: Sequence[str], paths: Collection[str]) -> tuple[str, ...]:
    """The ``paths`` (a change's, repository-relative) that the check commands run
    or name, sorted.

    A word of a command, the value after ``=`` in ``NAME=value``, or a word of a
    command line inside one (``sh -c '...'``) counts when it is one of
    ``paths``, with a leading ``./`` dropped. A tool that reads a file of its
    own counts that file: ``make`` its Makefile (or the one ``-f`` names),
    ``npm``, ``pnpm`` and ``yarn`` package.json, ``tox`` tox.ini, ``nox``
    noxfile.py, ``just`` its justfile, ``pytest`` (also as ``python -m
    pytest``) pytest.ini.
    """
    found: set[str] = set()
    for command in checks:
        words = _words(command)
        for index, word in enumerate(words):
            for candidate in (word, word.partition("=")[2]):
                path = candidate.removeprefix("./")
                if path in paths:
                    found.add(path)
            tool = word.rsplit("/", 1)[-1]
            found.update(name for name in _TOOL_FILES.get(tool, ()) if name in paths)
            if tool == "make":
                rest = words[index + 1 :]
                for flag, value in zip(rest, rest[1:], strict=False):
                    if flag == "-f" and value.removeprefix("./") in paths:
                        found.add(value.removeprefix("./"))
    return tuple(sorted(found))


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
    configured: Sequence[str] | None, checks: Sequence[str], paths: Collection[str]
) -> tuple[str, ...]:
    """Every protected pattern for a change of ``paths``: the cartridge file,
    ``configured`` (None: the default list) and ``check_files(checks, paths)``;
    in that order, once each."""
    given = DEFAULT_PROTECTED_PATHS if configured is None else tuple(configured)
    patterns = (CARTRIDGE_PATH, *given, *check_files(checks, paths))
    return tuple(dict.fromkeys(patterns))


def protected_touched(paths: Iterable[str], patterns: Sequence[str]) -> tuple[str, ...]:
    """The ``paths`` that match a protected pattern, sorted, each once."""
    return tuple(sorted({p for p in paths if any(path_matches(p, pat) for pat in patterns)}))
