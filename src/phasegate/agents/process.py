"""Running one agent process: prompt on stdin, a hard timeout, prompt shutdown.

Shared by every runner that drives a CLI (command, claude-code, codex). The
process runs under phasegate's supervisor, so a timeout or a shutdown stops it
and everything it started (``setsid()`` is no way out), and it dies with
phasegate; ``on_spawn`` learns the supervisor's pid first, so a restarted
worker can stop what is left if this one dies (``SideEffects.reconcile``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from phasegate.agents.base import AgentResult, Violation
from phasegate.proc.process import SpawnError, run_supervised
from phasegate.proc.sandbox import Confinement, refused_writes

__all__ = ["ProcessOutcome", "run_agent_process"]


@dataclass(frozen=True)
class ProcessOutcome:
    """How the process ended. ``stopped`` is "timeout", "interrupted", "fenced" (the
    lease's deadline passed: ``phasegate.proc.deadline``) or None."""

    stdout: str
    stderr: str
    returncode: int | None
    duration_s: float
    stopped: str | None = None
    spawn_error: str | None = None
    violations: tuple[Violation, ...] = ()

    def attach(self, result: AgentResult) -> AgentResult:
        """``result`` with this process's ``sandbox_denied`` violations added.

        The call's outcome stays what it was: the sandbox already refused the
        write; the violation is the record of the attempt.
        """
        if not self.violations:
            return result
        return replace(result, violations=(*result.violations, *self.violations))

    def failure(self, timeout_s: float) -> AgentResult | None:
        """The AgentResult for a process that did not finish on its own, else None."""
        if self.spawn_error is not None:
            return AgentResult("", error_kind="runner_error", error=self.spawn_error)
        if self.stopped == "interrupted":
            return AgentResult(
                self.stdout,
                error_kind="interrupted",
                error="stopped by shutdown",
                duration_s=self.duration_s,
            )
        if self.stopped == "fenced":
            return AgentResult(
                self.stdout,
                error_kind="self_fenced",
                error="stopped: this worker's lease was not renewed in time (self-fencing)",
                duration_s=self.duration_s,
            )
        if self.stopped == "timeout":
            return AgentResult(
                self.stdout,
                error_kind="timeout",
                error=f"no answer within {timeout_s:g}s; killed",
                duration_s=self.duration_s,
            )
        return None

    def ended(
        self,
        text: str,
        fields: Mapping[str, Any],
        *,
        model_error: str | None = None,
        refused: Iterable[str] = (),
    ) -> AgentResult:
        """The AgentResult of a process that ended on its own, by the precedence every
        CLI runner follows: the model's error (``model_error``: its message), then a
        refused tool call (``refused``: the tools' names), then a non-zero exit (the
        output's tail), else the answer ``text``. ``fields`` are the result's other
        fields (exit code, session, tokens, cost, duration)."""
        if model_error is not None:
            return AgentResult(text, error_kind="model_error", error=model_error, **fields)
        tools = sorted(set(refused))
        if tools:
            error = f"tool call refused: {', '.join(tools)}"
            return AgentResult(text, error_kind="permission_denied", error=error, **fields)
        if self.returncode:
            error = f"exited with code {self.returncode}: {self.tail()}"
            return AgentResult(text, error_kind="exit_code", error=error, **fields)
        return AgentResult(text, **fields)

    def tail(self, limit: int = 2000) -> str:
        return (self.stderr.strip() or self.stdout.strip())[-limit:]


def run_agent_process(
    args: str | Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    stdin: str,
    timeout_s: float,
    cancel: threading.Event,
    on_spawn: Callable[[int], None] | None = None,
    confinement: Confinement | None = None,
    transcript: Callable[[], str] | None = None,
    prompt: str | None = None,
    on_output: Callable[[str, bytes], None] | None = None,
) -> ProcessOutcome:
    """Run ``args`` (a shell command when a string) to completion, timeout (seconds)
    or shutdown, supervised (``phasegate.proc.process.run_supervised``) and confined
    by ``confinement`` (``phasegate.proc.sandbox``); a program that cannot start is a
    ``spawn_error``, never an exception.

    ``violations`` holds one ``sandbox_denied`` per write outside its areas
    that the process reported refused (``sandbox.refused_writes``) in its
    stdout, stderr, or ``transcript()`` (what a runner's agent wrote to a
    file: its trajectory); a line of ``prompt`` (default: ``stdin``) is not one.

    ``on_output(stream, data)`` sees stdout and stderr as they are read, while
    the process runs (``AgentRequest.on_output``: the live output)."""
    try:
        finished = run_supervised(
            args,
            cwd=cwd,
            env=env,
            stdin=stdin,
            timeout_s=timeout_s,
            cancel=cancel,
            on_spawn=on_spawn,
            confinement=confinement,
            on_output=on_output,
        )
    except SpawnError as exc:
        return ProcessOutcome("", "", None, 0.0, spawn_error=str(exc))
    violations: tuple[Violation, ...] = ()
    if confinement is not None and confinement.confined:
        seen = "\n".join([finished.stdout, finished.stderr, transcript() if transcript else ""])
        violations = tuple(
            Violation(
                "sandbox_denied",
                f"the sandbox refused a write to {path or 'a path it did not name'}: {line}",
                (path,) if path else (),
            )
            for path, line in refused_writes(
                seen, confinement, cwd, prompt=stdin if prompt is None else prompt
            )
        )
    return ProcessOutcome(
        finished.stdout,
        finished.stderr,
        finished.returncode,
        finished.duration_s,
        stopped=finished.stopped,
        violations=violations,
    )
