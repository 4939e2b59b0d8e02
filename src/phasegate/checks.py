"""Running the cartridge's checks (``landing_areas.checks``): each command in a
session of its own, with a timeout, its output captured and redacted."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from phasegate._process import kill_process_group
from phasegate.contract import WorkflowPaused

__all__ = ["CheckResult", "run_checks"]

_OUTPUT_TAIL = 4000  # characters of a check's output kept as evidence
_POLL_S = 0.2  # how often a running check looks for a shutdown


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


def _redact(text: str, secrets: Sequence[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, "***")
    return text


def run_checks(
    commands: Sequence[str],
    cwd: Path,
    timeout_s: float,
    cancel: threading.Event | None = None,
    *,
    env: Mapping[str, str] | None = None,
    secrets: Sequence[str] = (),
) -> list[CheckResult]:
    """Run each check command in ``cwd`` with a timeout in seconds; capture its output.

    ``env`` is the commands' whole environment (None: this process's);
    every value in ``secrets`` is redacted from the output, which becomes
    evidence, a reason shown to people and the next build prompt. Raises
    WorkflowPaused, after killing the running check, when ``cancel`` is
    set: a shutdown must not wait out a long test suite.
    """
    results = []
    for command in commands:
        started = time.monotonic()
        proc = subprocess.Popen(
            command,
            shell=True,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            encoding="utf-8",
            errors="replace",
            start_new_session=True,
            env=None if env is None else dict(env),
        )
        deadline = started + timeout_s
        timed_out = False
        while True:
            try:
                output, _ = proc.communicate(
                    timeout=max(0.01, min(_POLL_S, deadline - time.monotonic()))
                )
                break
            except subprocess.TimeoutExpired:
                if cancel is not None and cancel.is_set():
                    kill_process_group(proc)
                    proc.communicate()
                    raise WorkflowPaused(f"shutdown while the check {command!r} ran") from None
                if time.monotonic() >= deadline:
                    kill_process_group(proc)
                    output, _ = proc.communicate()
                    timed_out = True
                    break
        results.append(
            CheckResult(
                command=command,
                exit_code=None if timed_out else proc.returncode,
                duration_s=round(time.monotonic() - started, 3),
                output=_redact(output or "", secrets)[-_OUTPUT_TAIL:],
                timed_out=timed_out,
            )
        )
    return results
