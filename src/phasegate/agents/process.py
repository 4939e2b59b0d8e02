"""Running one agent process: prompt on stdin, a hard timeout, prompt shutdown.

Shared by every runner that drives a CLI (command, claude-code, codex). The
process runs in a session of its own, so a timeout or a shutdown kills it and
everything it started; ``on_spawn`` learns the group's leader first, so a
restarted worker can stop it if this one dies (``SideEffects.reconcile``).
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from phasegate._process import kill_process_group
from phasegate.agents.base import AgentResult

__all__ = ["ProcessOutcome", "run_agent_process"]

_POLL_S = 0.2


@dataclass(frozen=True)
class ProcessOutcome:
    """How the process ended. ``stopped`` is "timeout", "interrupted" or None."""

    stdout: str
    stderr: str
    returncode: int | None
    duration_s: float
    stopped: str | None = None
    spawn_error: str | None = None

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
        if self.stopped == "timeout":
            return AgentResult(
                self.stdout,
                error_kind="timeout",
                error=f"no answer within {timeout_s:g}s; killed",
                duration_s=self.duration_s,
            )
        return None

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
) -> ProcessOutcome:
    """Run ``args`` (a shell command when a string) to completion, timeout or shutdown."""
    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            args,
            shell=isinstance(args, str),
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            encoding="utf-8",
            errors="replace",
            start_new_session=True,
        )
    except OSError as exc:
        return ProcessOutcome("", "", None, 0.0, spawn_error=f"cannot start {args!r}: {exc}")
    if on_spawn is not None:
        try:
            on_spawn(proc.pid)
        except BaseException:
            kill_process_group(proc)  # unrecorded, it could not be stopped after a crash
            raise
    deadline = started + timeout_s
    pending: str | None = stdin  # communicate() takes the input on its first call only
    while True:
        remaining = deadline - time.monotonic()
        try:
            stdout, stderr = proc.communicate(
                input=pending, timeout=max(0.01, min(_POLL_S, remaining))
            )
            break
        except subprocess.TimeoutExpired:
            pending = None
            if cancel.is_set() or time.monotonic() >= deadline:
                kill_process_group(proc)
                stdout, stderr = proc.communicate()
                return ProcessOutcome(
                    stdout or "",
                    stderr or "",
                    proc.returncode,
                    time.monotonic() - started,
                    stopped="interrupted" if cancel.is_set() else "timeout",
                )
        except BrokenPipeError:
            # It exited without reading its prompt; its exit code decides.
            stdout, stderr = proc.communicate()
            break
    return ProcessOutcome(stdout or "", stderr or "", proc.returncode, time.monotonic() - started)
