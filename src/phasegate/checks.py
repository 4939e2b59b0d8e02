"""Running the cartridge's checks (``landing_areas.checks``): each command
supervised, with a timeout, its output captured and redacted."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

from phasegate._process import run_supervised
from phasegate.contract import WorkflowPaused
from phasegate.redaction import redact
from phasegate.sandbox import Confinement, for_checkout

__all__ = ["CheckResult", "run_checks"]

_OUTPUT_TAIL = 4000  # characters of a check's output kept as evidence


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
) -> list[CheckResult]:
    """Run each check command in ``cwd`` with a timeout in seconds; capture its output.

    ``env`` is the commands' whole environment (None: this process's);
    every value in ``secrets`` is redacted from the output, raw or encoded
    (``phasegate.redaction``), which becomes
    evidence, a reason shown to people and the next build prompt.
    ``on_spawn(command, pid)`` learns each check's supervisor before the
    check works, so a restarted worker can stop it if this one dies
    (``ProcessJournal``). Each check runs supervised (``run_supervised``):
    its timeout and a cancellation stop its whole subtree, a descendant
    that called ``setsid()`` included, and what it leaves running when it
    exits is stopped too. Raises WorkflowPaused, after stopping the running
    check, when ``cancel`` is set: a shutdown must not wait out a long test
    suite; and when the lease it runs under reached its deadline
    (``phasegate._deadline``): the check was stopped, its result means
    nothing. Raises SpawnError (an OSError) when a check cannot start
    (``cwd`` missing). A ``confinement`` (``sandbox.check_confinement``) runs each
    check in its sandbox with ``cwd`` writable (its ``.git`` not) and a
    private temp dir; None runs them unconfined.
    """
    if confinement is not None:
        confinement = for_checkout(confinement, cwd)
    results = []
    for command in commands:
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
        if finished.stopped == "interrupted":
            raise WorkflowPaused(f"shutdown while the check {command!r} ran")
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
                output=redact(finished.stdout, secrets)[-_OUTPUT_TAIL:],
                timed_out=finished.stopped == "timeout",
            )
        )
    return results
