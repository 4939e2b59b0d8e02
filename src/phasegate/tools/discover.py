"""What this machine and this repository offer: agent CLIs, model keys, git, checks.

Read by ``phasegate init`` (to choose the cartridge's defaults) and
``phasegate doctor`` (to say what a run still needs). Nothing here writes;
nothing here reads a key's value beyond whether it is set and non-empty.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from phasegate.config.agents import AGENT_PROGRAMS
from phasegate.config.toml import TomlError, read_toml
from phasegate.git.command import run_git

__all__ = [
    "AGENT_CLIS",
    "MODEL_KEY_VARS",
    "CheckGuess",
    "Which",
    "detect_base_branch",
    "detect_checks",
    "git_version",
    "keys_set",
    "program_version",
]

#: The agent CLIs phasegate drives, by executable name.
AGENT_CLIS = tuple(program.executable for program in AGENT_PROGRAMS.values())

#: Environment variables that hold model keys, reported as set or not (never their values).
MODEL_KEY_VARS = (
    "ANTHROPIC_API_KEY",
    "OPENAI_API_KEY",
    "GEMINI_API_KEY",
    "GOOGLE_API_KEY",
    "MISTRAL_API_KEY",
    "GROQ_API_KEY",
    "DEEPSEEK_API_KEY",
    "OPENROUTER_API_KEY",
    "XAI_API_KEY",
    "AZURE_API_KEY",
)

#: ``shutil.which``'s shape; tests pass their own.
Which = Callable[[str], str | None]

_VERSION_TIMEOUT_S = 10.0


def keys_set(names: Iterable[str], environ: Mapping[str, str] | None = None) -> dict[str, bool]:
    """``{name: set and non-empty}`` for each name, in order; values are never returned."""
    source = os.environ if environ is None else environ
    return {name: bool(source.get(name)) for name in dict.fromkeys(names)}


_BANNER_VERSION = re.compile(r"\bversion v?\d+\.\d+")


def program_version(
    executable: str, timeout_s: float = _VERSION_TIMEOUT_S
) -> tuple[str | None, str | None]:
    """``(version, error)`` from ``executable --version``: its first output line, or why not.

    Run with a short timeout and no stdin, so a CLI that wants a terminal cannot hang us.
    A non-zero exit is an error unless a line of the output names a version
    (``... version 2.4.6``): a CLI with no ``--version`` option of its own.
    """
    try:
        proc = subprocess.run(
            [executable, "--version"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return None, f"`{executable} --version` gave no answer within {timeout_s:g}s"
    except OSError as exc:
        return None, f"cannot run {executable}: {exc.strerror or exc}"
    lines = (proc.stdout.strip() or proc.stderr.strip()).splitlines()
    if proc.returncode != 0:
        # A CLI without --version that names its version in a banner before refusing
        # the option (mini-swe-agent: "This is mini-swe-agent version 2.4.6.", exit 2).
        banner = next((line for line in lines if _BANNER_VERSION.search(line)), None)
        if banner is not None:
            return banner.strip()[:200], None
        detail = lines[0][:200] if lines else ""
        return None, f"`{executable} --version` exited with code {proc.returncode}: {detail}"
    return (lines[0].strip()[:200] if lines else ""), None


def git_version(which: Which = shutil.which) -> str | None:
    """``"2.39.5"``, or None when git is not on PATH."""
    exe = which("git")
    if exe is None:
        return None
    version, _ = program_version(exe)
    if version is None:
        return None
    match = re.search(r"\d+(\.\d+)+", version)
    return match.group(0) if match else version


def _git(repo: Path, *args: str) -> str | None:
    proc = run_git(args, repo)  # hardened like all of phasegate's git
    return proc.stdout.strip() if proc.returncode == 0 else None


def detect_base_branch(repo: Path) -> tuple[str, str]:
    """``(branch, why)``: the branch a repository's tickets should land on.

    The remote's default branch when there is one, else the current branch
    when it is a usual trunk name, else ``main``/``master`` when they exist,
    else the current branch, else ``main``; ``main`` too for a repository not made
    yet (``run --new-project``).
    """
    if not repo.is_dir():
        return "main", "a new repository"
    current = _git(repo, "symbolic-ref", "--short", "-q", "HEAD")
    remote_head = _git(repo, "symbolic-ref", "--short", "-q", "refs/remotes/origin/HEAD")
    if remote_head and "/" in remote_head:
        name = remote_head.split("/", 1)[1]
        if _git(repo, "rev-parse", "--verify", "-q", f"refs/heads/{name}") is not None:
            return name, "the remote's default branch"
    if current in ("main", "master", "trunk", "develop"):
        return current, "the current branch"
    for name in ("main", "master"):
        if _git(repo, "rev-parse", "--verify", "-q", f"refs/heads/{name}") is not None:
            return name, "the repository's trunk"
    if current:
        return current, "the current branch"
    return "main", "a guess: HEAD is detached"


@dataclass(frozen=True)
class CheckGuess:
    """A check command proposed for ``landing_areas.checks`` and what suggested it."""

    command: str
    why: str


def _has_pytest_config(repo: Path) -> str | None:
    if (repo / "pytest.ini").is_file():
        return "pytest.ini"
    if (repo / "conftest.py").is_file():
        return "conftest.py"
    pyproject = repo / "pyproject.toml"
    if pyproject.is_file():
        try:
            data = read_toml(pyproject)
        except TomlError:
            data = {}
        if "pytest" in data.get("tool", {}):
            return "[tool.pytest] in pyproject.toml"
    for name, section in (("setup.cfg", "[tool:pytest]"), ("tox.ini", "[pytest]")):
        path = repo / name
        try:
            if path.is_file() and section in path.read_text(encoding="utf-8", errors="replace"):
                return f"{section} in {name}"
        except OSError:
            continue
    return None


def _python_tests_dir(repo: Path) -> str | None:
    for name in ("tests", "test"):
        folder = repo / name
        if folder.is_dir() and next(folder.rglob("*.py"), None) is not None:
            return f"{name}/ with Python files"
    return None


def _npm_test(repo: Path) -> bool:
    try:
        data = json.loads((repo / "package.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    script = (data.get("scripts") or {}).get("test") if isinstance(data, dict) else None
    # `npm init` writes a test script that only fails: it is not a test suite.
    return bool(script) and "no test specified" not in str(script)


def _make_test(repo: Path) -> bool:
    for name in ("Makefile", "makefile", "GNUmakefile"):
        path = repo / name
        try:
            if path.is_file() and re.search(
                r"^test\s*:", path.read_text(encoding="utf-8", errors="replace"), re.M
            ):
                return True
        except OSError:
            continue
    return False


def detect_checks(repo: Path) -> list[CheckGuess]:
    """The checks a repository's own files suggest, for ``landing_areas.checks``.

    A Makefile ``test`` target is the project's own entry point and wins alone;
    otherwise one check per ecosystem found: pytest (a pytest config, or a
    tests/ folder with Python files), ``npm test`` (package.json with a real
    test script), ``cargo test`` (Cargo.toml), ``go test ./...`` (go.mod).
    """
    if _make_test(repo):
        return [CheckGuess("make test", "a `test` target in the Makefile")]
    found: list[CheckGuess] = []
    why = _has_pytest_config(repo) or _python_tests_dir(repo)
    if why:
        found.append(CheckGuess("python -m pytest -q", why))
    if _npm_test(repo):
        found.append(CheckGuess("npm test", "a test script in package.json"))
    if (repo / "Cargo.toml").is_file():
        found.append(CheckGuess("cargo test", "Cargo.toml"))
    if (repo / "go.mod").is_file():
        found.append(CheckGuess("go test ./...", "go.mod"))
    return found
