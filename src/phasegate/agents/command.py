"""The ``command`` runner: any shell command is an agent.

The prompt goes to the command's stdin, to ``PHASEGATE_PROMPT`` (when under
100 kB) and to the file named by ``PHASEGATE_PROMPT_FILE``; stdout is the
answer. The command runs in the worktree in a session of its own, so a timeout
or a shutdown kills it and everything it started.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from phasegate._process import kill_process_group
from phasegate.agents.base import AgentRequest, AgentResult

__all__ = ["CommandRunner"]

_ENV_PROMPT_LIMIT = 100_000  # Linux refuses a single env string over 128 kB
_POLL_S = 0.2


class CommandRunner:
    name = "command"

    def __init__(self, command: str, env: Mapping[str, str] | None = None) -> None:
        self.command = command
        self.env = dict(env or {})

    def run(
        self,
        request: AgentRequest,
        cancel: threading.Event,
        on_spawn: Callable[[int], None] | None = None,
    ) -> AgentResult:
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="phasegate-prompt-") as tmp:
            prompt_file = Path(tmp) / "prompt.md"
            prompt_file.write_text(request.prompt, encoding="utf-8")
            env = {
                **os.environ,
                **self.env,
                **request.env,
                "PHASEGATE_ROLE": request.role,
                "PHASEGATE_PHASE": request.phase,
                "PHASEGATE_SESSION_LINE": request.session_line,
                "PHASEGATE_WORKFLOW_ID": request.workflow_id,
                "PHASEGATE_CALL_INDEX": str(request.call_index),
                "PHASEGATE_READ_ONLY": "1" if request.read_only else "0",
                "PHASEGATE_PROMPT_FILE": str(prompt_file),
            }
            if len(request.prompt) < _ENV_PROMPT_LIMIT:
                env["PHASEGATE_PROMPT"] = request.prompt
            try:
                proc = subprocess.Popen(
                    self.command,
                    shell=True,
                    cwd=request.cwd,
                    env=env,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    start_new_session=True,
                )
            except OSError as exc:
                return AgentResult("", error_kind="runner_error", error=str(exc))
            if on_spawn is not None:
                try:
                    on_spawn(proc.pid)
                except BaseException:
                    kill_process_group(proc)  # unrecorded, it could not be stopped after a crash
                    raise
            return self._wait(proc, request, cancel, started)

    def _wait(
        self,
        proc: subprocess.Popen[str],
        request: AgentRequest,
        cancel: threading.Event,
        started: float,
    ) -> AgentResult:
        deadline = started + request.timeout_s
        prompt: str | None = request.prompt  # communicate() takes the input once only
        while True:
            remaining = deadline - time.monotonic()
            try:
                stdout, stderr = proc.communicate(
                    input=prompt, timeout=max(0.01, min(_POLL_S, remaining))
                )
                break
            except subprocess.TimeoutExpired:
                prompt = None
                if cancel.is_set() or time.monotonic() >= deadline:
                    kill_process_group(proc)
                    stdout, stderr = proc.communicate()
                    kind = "interrupted" if cancel.is_set() else "timeout"
                    message = (
                        "stopped by shutdown"
                        if kind == "interrupted"
                        else f"no answer within {request.timeout_s:g}s; killed"
                    )
                    return AgentResult(
                        stdout or "",
                        error_kind=kind,
                        error=message,
                        duration_s=time.monotonic() - started,
                    )
            except BrokenPipeError:
                # The agent exited without reading its prompt; its exit code decides.
                stdout, stderr = proc.communicate()
                break
        duration = time.monotonic() - started
        if proc.returncode != 0:
            tail = (stderr or stdout or "").strip()[-2000:]
            return AgentResult(
                stdout,
                error_kind="exit_code",
                error=f"exited with code {proc.returncode}: {tail}",
                exit_code=proc.returncode,
                duration_s=duration,
            )
        return AgentResult(stdout, exit_code=0, duration_s=duration)
