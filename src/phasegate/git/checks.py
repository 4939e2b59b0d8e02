"""Running the cartridge's checks (``landing_areas.checks``): each command
supervised, with a timeout, its output captured and redacted."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

from phasegate.core.contract import PhasegateError, WorkflowPaused
from phasegate.core.redaction import redact
from phasegate.git.check_probe import program_problem
from phasegate.proc.process import SpawnError, run_supervised
from phasegate.proc.sandbox import Confinement, for_checkout

__all__ = [
    "OUTPUT_TAIL",
    "CheckResult",
    "CheckUnstartable",
    "check_problem",
    "command_problem",
    "run_checks",
]

OUTPUT_TAIL = 4000  # characters of a check's output kept as evidence

#: Bytes Linux lets one argument (or one environment string) of an exec have
#: (MAX_ARG_STRLEN, 32 pages); a check command is one argument of ``sh -c``.
MAX_ARG_BYTES = 32 * os.sysconf("SC_PAGE_SIZE")
#: Bytes the arguments and the environment of an exec may have together.
ARG_MAX_BYTES = os.sysconf("SC_ARG_MAX")
#: Bytes left for what wraps a check: the supervisor's own arguments, a sandbox's.
_WRAPPING_BYTES = 16 * 1024


class CheckUnstartable(PhasegateError):
    """A check command the OS cannot start (too long, a NUL character, ...) or that
    could never pass (its program is missing: ``check_probe``); the
    message names its key (``landing_areas.checks[i]``) and why, never the whole
    command. A resume finds it the same until the cartridge changes."""


def command_problem(command: str, env: Mapping[str, str] | None = None) -> str | None:
    """Why the OS would refuse to start the check ``command`` with the environment
    ``env`` (None: this process's), in a sentence; None when it can start.

    Linux refuses an exec whose one argument is over ``MAX_ARG_BYTES`` or whose
    arguments and environment are over ``ARG_MAX_BYTES`` together (E2BIG), and
    no argument can carry a NUL character. Judged before anything is spawned,
    so ``phasegate doctor`` and a run say the same.
    """
    if "\0" in command:
        return "it holds a NUL character, which no command line can carry"
    size = len(command.encode("utf-8", errors="surrogateescape"))
    fix = "put the command in a script and name the script"
    if size > MAX_ARG_BYTES - _WRAPPING_BYTES:
        return (
            f"it is {size:,} bytes, and the OS starts no command whose one argument is "
            f"over {MAX_ARG_BYTES:,} bytes (E2BIG, argument list too long): {fix}"
        )
    environment = os.environ if env is None else env
    total = size + sum(len(k.encode()) + len(v.encode()) + 2 for k, v in environment.items())
    if total > ARG_MAX_BYTES - _WRAPPING_BYTES:
        return (
            f"it is {size:,} bytes, and with the environment's it is over the "
            f"{ARG_MAX_BYTES:,} bytes the OS lets a command start with (E2BIG): {fix}"
        )
    return None


def check_problem(
    i: int, command: str, env: Mapping[str, str], cwd: Path, *, key: str | None = None
) -> str | None:
    """Why ``landing_areas.checks[i]`` (``command``, run in ``cwd`` with ``env``)
    cannot start (``command_problem``) or could never pass
    (``check_probe.program_problem``), as the one line a run pauses with and
    ``phasegate doctor`` lists; None when neither. ``key`` names the command
    instead of ``landing_areas.checks[i]`` (``landing_areas.setup``)."""
    name = key or f"landing_areas.checks[{i}]"
    problem = command_problem(command, env)
    if problem is not None:
        return f"{name} cannot start: {problem}"
    # A check that could never pass would fail every attempt of every build.
    problem = program_problem(command, env, cwd)
    if problem is not None:
        return f"{name} cannot run: {problem}"
    return None


@dataclass(frozen=True)
class CheckResult:
    """One check command's result: exit code (None on timeout), seconds, output tail."""

    command: str
    exit_code: int | None
    duration_s: float
    output: str
    timed_out: bool = False

    @property
    def passed(self) -> bool:
        return self.exit_code == 0

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "passed": self.passed}


def run_checks(
    commands: Sequence[str],
    cwd: Path,
    timeout_s: float,
    cancel: threading.Event | None = None,
    *,
    env: Mapping[str, str] | None = None,
    secrets: Sequence[str] = (),
    on_spawn: Callable[[str, int], None] | None = None,
    confinement: Confinement | None = None,
    key: str | None = None,
) -> list[CheckResult]:
    """Run each check command in ``cwd`` with a timeout in seconds; capture its output.

    ``env`` is the commands' whole environment (None: this process's);
    every value in ``secrets`` is redacted from the output, raw or encoded
    (``phasegate.core.redaction``), which becomes
    evidence, a reason shown to people and the next build prompt.
    ``on_spawn(command, pid)`` learns each check's supervisor before the
    check works, so a restarted worker can stop it if this one dies
    (``ProcessJournal``). Each check runs supervised (``run_supervised``):
    its timeout and a cancellation stop its whole subtree, a descendant
    that called ``setsid()`` included, and what it leaves running when it
    exits is stopped too. Raises WorkflowPaused, after stopping the running
    check, when ``cancel`` is set: a shutdown must not wait out a long test
    suite; and when the lease it runs under reached its deadline
    (``phasegate.proc.deadline``): the check was stopped, its result means
    nothing. Raises CheckUnstartable, naming ``landing_areas.checks[i]``
    (``i`` its index in ``commands``), when a check cannot start: the OS would
    refuse it (``command_problem``), or refused it (``cwd`` missing), or it could
    never pass (``check_probe.program_problem``: its program is missing). A
    ``confinement`` (``sandbox.check_confinement``) runs each
    check in its sandbox with ``cwd`` writable (its ``.git`` not) and a
    private temp dir; None runs them unconfined. ``key`` names the commands in
    errors instead of ``landing_areas.checks[i]`` (the worktree's
    ``landing_areas.setup`` runs here too).
    """
    if confinement is not None:
        confinement = for_checkout(confinement, cwd)
    results = []
    for i, command in enumerate(commands):
        problem = check_problem(i, command, os.environ if env is None else env, cwd, key=key)
        if problem is not None:
            raise CheckUnstartable(problem)
        try:
            finished = run_supervised(
                command,
                cwd=cwd,
                env=env,
                stdin=None,
                timeout_s=timeout_s,
                cancel=cancel,
                on_spawn=None if on_spawn is None else partial(on_spawn, command),
                merge_stderr=True,
                confinement=confinement,
            )
        except SpawnError as exc:
            # The errno's words: the spawn's message would repeat the whole command.
            why = os.strerror(exc.errno) if exc.errno else str(exc)[:300]
            name = key or f"landing_areas.checks[{i}]"
            raise CheckUnstartable(f"{name} cannot start: {why}") from None
        if finished.stopped == "interrupted":
            what = f"{key} {command!r}" if key else f"the check {command!r}"
            raise WorkflowPaused(f"shutdown while {what} ran")
        if finished.stopped == "fenced":
            raise WorkflowPaused(
                f"the check {command!r} was stopped: this worker's lease was not renewed "
                "in time (self-fencing)"
            )
        results.append(
            CheckResult(
                command=command,
                exit_code=finished.returncode,
                duration_s=round(finished.duration_s, 3),
                output=redact(finished.stdout, secrets)[-OUTPUT_TAIL:],
                timed_out=finished.stopped == "timeout",
            )
        )
    return results
