"""Protected paths: the files whose change by an agent waits for a person, whatever the profile.

The rules a team sets live in files of its repository: the cartridge, its CI
configuration and the files its checks run. An agent that changed them could
lower the bar for every later change (a role's sandbox off, a check that always
passes), so a change touching one never merges unattended (docs/trust.md).

Pure module: the tracked files and the cartridge's settings come in, patterns
and matches go out.

- ``DEFAULT_PROTECTED_PATHS``: ``[workflow] protected_paths`` when the cartridge
  names none.
- ``check_files``: the tracked files a check command runs or is configured by.
- ``protected_patterns``: the cartridge file, the configured paths and the
  check files, as patterns of ``graph.facts.path_matches``.
- ``protected_touched``: the paths of a change that match one of them.
"""

from __future__ import annotations

import shlex
from collections.abc import Collection, Iterable, Sequence

from phasegate.graph.facts import path_matches

__all__ = [
    "CARTRIDGE_PATH",
    "DEFAULT_PROTECTED_PATHS",
    "check_files",
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
    try:
        return shlex.split(command)
    except ValueError:  # an unbalanced quote: the shell will refuse it anyway
        return command.split()


def check_files(checks: Sequence[str], tracked: Collection[str]) -> tuple[str, ...]:
    """The tracked files the check commands run, sorted.

    A word of a command (or the value after ``=`` in ``NAME=value``) that is a
    tracked path counts, with a leading ``./`` dropped. A tool that reads a file
    of its own counts that file when it is tracked: ``make`` its Makefile (or the
    one ``-f`` names), ``npm``, ``pnpm`` and ``yarn`` package.json, ``tox``
    tox.ini, ``nox`` noxfile.py, ``just`` its justfile, ``pytest`` (also as
    ``python -m pytest``) pytest.ini.
    """
    found: set[str] = set()
    for command in checks:
        words = _words(command)
        for index, word in enumerate(words):
            for candidate in (word, word.partition("=")[2]):
                path = candidate.removeprefix("./")
                if path in tracked:
                    found.add(path)
            tool = word.rsplit("/", 1)[-1]
            if index > 0 and words[index - 1] == "-m":
                tool = word  # python -m pytest
            found.update(name for name in _TOOL_FILES.get(tool, ()) if name in tracked)
            if tool == "make":
                rest = words[index + 1 :]
                for flag, value in zip(rest, rest[1:], strict=False):
                    if flag == "-f" and value.removeprefix("./") in tracked:
                        found.add(value.removeprefix("./"))
    return tuple(sorted(found))


def protected_patterns(
    configured: Sequence[str] | None, checks: Sequence[str], tracked: Collection[str]
) -> tuple[str, ...]:
    """Every protected pattern: the cartridge file, ``configured`` (None: the
    default list) and ``check_files(checks, tracked)``; in that order, once each."""
    given = DEFAULT_PROTECTED_PATHS if configured is None else tuple(configured)
    patterns = (CARTRIDGE_PATH, *given, *check_files(checks, tracked))
    return tuple(dict.fromkeys(patterns))


def protected_touched(paths: Iterable[str], patterns: Sequence[str]) -> tuple[str, ...]:
    """The ``paths`` that match a protected pattern, sorted, each once."""
    return tuple(sorted({p for p in paths if any(path_matches(p, pat) for pat in patterns)}))
