"""What a check command needs before it can test anything: its program, and a Python's module.

``phasegate doctor`` asks this of each ``landing_areas.checks`` command, and
so does a run before each check (``run_checks``): a check that could never
pass pauses the workflow with one line naming it, rather than failing every
build's attempts (a ``pytest`` that is not installed, a ``python -m pytest``
whose Python lacks pytest). Only the plain case is judged, so a wrong
judgement never stops a check that would run: a simple command (words and
leading ``NAME=value`` assignments, nothing the shell would read as syntax)
whose first word is a program looked up on the PATH the checks get. Anything
else (a path, a pipeline, a list, a redirection, a compound command, a
builtin) is left to the run, which reports what the check printed.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

__all__ = ["program_problem"]

#: Words a shell runs or reads itself (builtins, reserved words): never programs.
_BUILTINS = frozenset(
    {"!", ".", ":", "[", "[[", "{", "alias", "case", "cd", "command", "coproc", "do",
     "done", "echo", "elif", "else", "esac", "eval", "exec", "exit", "export", "false",
     "fi", "for", "function", "if", "printf", "read", "select", "set", "shift", "source",
     "test", "then", "time", "trap", "true", "type", "ulimit", "umask", "unset", "until",
     "wait", "while"}
)  # fmt: skip
#: A shell's syntax: a command holding any is the shell's to read, not ours.
_SHELL = re.compile(r"[|&;<>()$`\\*?{}\[\]~#!\n]")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
#: Seconds the probe of a Python's module may take (an interpreter's start, a lookup).
PROBE_TIMEOUT_S = 20.0
_FINDS_MODULE = (
    "import importlib.util, sys; sys.exit(importlib.util.find_spec(sys.argv[1]) is None)"
)


def program_problem(command: str, env: Mapping[str, str], cwd: Path) -> str | None:
    """Why ``command`` cannot run as the checks would run it (``env`` their whole
    environment, ``cwd`` the checkout), in a sentence; None when it can or when
    only running it would tell. Runs at most one short process: a Python asked,
    with the command's own assignments, whether it has the module of
    ``python -m MODULE``."""
    if _SHELL.search(command):
        return None
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    assigned = {}
    while words and _ASSIGNMENT.match(words[0]):
        name, _, value = words.pop(0).partition("=")
        assigned[name] = value
    if not words or words[0] in _BUILTINS:
        return None
    if words[0].startswith("/"):  # a relative path may be the build's to write
        program = words[0]
        if not os.access(program, os.X_OK) or os.path.isdir(program):
            return f"`{program}` is not a program that can run (missing, or not executable)"
    elif "/" in words[0]:
        return None
    else:
        path = assigned.get("PATH", env.get("PATH", ""))
        found = shutil.which(words[0], path=path)
        if found is None:
            shown = path if len(path) <= 200 else path[:199] + "…"
            return f"`{words[0]}` is not on the PATH the checks get ({shown or 'empty'})"
        program = found
    name = os.path.basename(words[0])
    if not (_PYTHON.match(name) and len(words) > 2 and words[1] == "-m"):
        return None
    module = words[2]
    if not _MODULE.match(module):
        return None
    try:
        probe = subprocess.run(
            [program, "-c", _FINDS_MODULE, module],
            cwd=cwd,
            env={**env, **assigned},
            capture_output=True,
            timeout=PROBE_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if probe.returncode != 1:
        return None
    return (
        f"`{words[0]}` is {program}, which has no module {module!r}: install {module} in "
        f"that Python, or name the Python that has it (e.g. `.venv/bin/python -m {module}`)"
    )
