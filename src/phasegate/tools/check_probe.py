"""What a check command needs before it can test anything: its program, and a Python's module.

``phasegate doctor`` asks this of each ``landing_areas.checks`` command, so a
check that could never pass is named before the first run spends a build on
it (a ``pytest`` that is not installed, a ``python -m pytest`` whose Python
lacks pytest). Only the plain case is judged: a command whose first word is a
program looked up on the PATH the checks get. Anything else (a path, a shell
construct, a builtin) is left to the run, which reports what the check printed.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

__all__ = ["program_problem"]

#: Words a shell runs itself, or may: never looked up as programs.
_BUILTINS = frozenset(
    {".", ":", "[", "alias", "cd", "command", "echo", "eval", "exec", "exit", "export",
     "false", "printf", "read", "set", "shift", "source", "test", "trap", "true",
     "type", "ulimit", "umask", "unset", "wait"}
)  # fmt: skip
#: A shell's syntax in a word: such a command is the shell's to read, not ours.
_SHELL = re.compile(r"[|&;<>()$`\\\"'*?{}\[\]~]")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")
#: Seconds the probe of a Python's module may take (an interpreter's start, a lookup).
PROBE_TIMEOUT_S = 20.0
_FINDS_MODULE = (
    "import importlib.util, sys; sys.exit(importlib.util.find_spec(sys.argv[1]) is None)"
)


def program_problem(command: str, env: Mapping[str, str], cwd: Path) -> str | None:
    """Why ``command`` cannot run as the checks would run it (``env`` their whole
    environment, ``cwd`` the checkout), in a sentence; None when it can or when
    only running it would tell. Runs at most one short process: a Python asked
    whether it has the module of ``python -m MODULE``."""
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    while words and _ASSIGNMENT.match(words[0]):
        words = words[1:]
    if not words or words[0] in _BUILTINS or "/" in words[0] or _SHELL.search(words[0]):
        return None
    path = env.get("PATH", "")
    program = shutil.which(words[0], path=path)
    if program is None:
        shown = path if len(path) <= 200 else path[:199] + "…"
        return f"`{words[0]}` is not on the PATH the checks get ({shown or 'empty'})"
    if not (_PYTHON.match(words[0]) and len(words) > 2 and words[1] == "-m"):
        return None
    module = words[2]
    try:
        probe = subprocess.run(
            [program, "-c", _FINDS_MODULE, module],
            cwd=cwd,
            env=dict(env),
            capture_output=True,
            timeout=PROBE_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if probe.returncode == 1:
        return f"`{words[0]}` ({program}) has no module {module!r}: install it there"
    return None
