"""The ``command`` runner: any shell command is an agent.

The prompt goes to the command's stdin (written whole, however late the
command reads it), to ``PHASEGATE_PROMPT`` (only when under 100,000 bytes in
UTF-8: Linux refuses to exec with one environment string over 128 KiB, E2BIG)
and always to the file named by ``PHASEGATE_PROMPT_FILE``; stdout is the
answer. The command runs in the worktree, with PATH, the locale, HOME/USER/
SHELL, PYTHONPATH and what the role binding names (``env``, ``pass_env``,
``api_key_env``); ``PHASEGATE_PYTHON`` names the Python running phasegate, so a
command can run a module installed with it (init's sample agent does).
"""

from __future__ import annotations

import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from phasegate.agents.base import AgentRequest, AgentResult
from phasegate.agents.env import BASE_ENV, child_env
from phasegate.agents.process import run_agent_process
from phasegate.config.cartridge import RoleBinding

__all__ = ["CommandRunner"]

# bytes; Linux refuses a single env string over 128 KiB (MAX_ARG_STRLEN): E2BIG
_ENV_PROMPT_LIMIT = 100_000
# A user's own command may rely on its home (its tools' logins live there). PYTHONPATH
# goes too: "$PHASEGATE_PYTHON" -m then imports the phasegate that runs it, however found.
_COMMAND_ENV = (*BASE_ENV, "HOME", "USER", "SHELL", "PYTHONPATH")


class CommandRunner:
    name = "command"

    def __init__(self, binding: RoleBinding) -> None:
        assert binding.command is not None
        self.binding = binding
        self.command = binding.command

    def run(
        self,
        request: AgentRequest,
        cancel: threading.Event,
        on_spawn: Callable[[int], None] | None = None,
    ) -> AgentResult:
        with tempfile.TemporaryDirectory(prefix="phasegate-prompt-") as tmp:
            prompt_file = Path(tmp) / "prompt.md"
            prompt_file.write_text(request.prompt, encoding="utf-8")
            extra = {
                "PHASEGATE_ROLE": request.role,
                "PHASEGATE_PHASE": request.phase,
                "PHASEGATE_SESSION_LINE": request.session_line,
                "PHASEGATE_WORKFLOW_ID": request.workflow_id,
                "PHASEGATE_CALL_INDEX": str(request.call_index),
                "PHASEGATE_READ_ONLY": "1" if request.read_only else "0",
                "PHASEGATE_PROMPT_FILE": str(prompt_file),
                "PHASEGATE_PYTHON": sys.executable or "python3",
                **request.env,  # the worktree's ports (PHASEGATE_PORT_BASE, _COUNT)
            }
            # Bytes, not characters: 40,000 CJK characters are 120,000 bytes.
            if len(request.prompt.encode("utf-8", errors="replace")) < _ENV_PROMPT_LIMIT:
                extra["PHASEGATE_PROMPT"] = request.prompt
            outcome = run_agent_process(
                self.command,
                cwd=request.cwd,
                env=child_env(self.binding, _COMMAND_ENV, extra),
                stdin=request.prompt,
                timeout_s=request.timeout_s,
                cancel=cancel,
                on_spawn=on_spawn,
                confinement=request.confinement,
                on_output=request.on_output,
            )
        failure = outcome.failure(request.timeout_s)
        if failure is not None:
            return outcome.attach(failure)
        if outcome.returncode != 0:
            return outcome.attach(
                AgentResult(
                    outcome.stdout,
                    error_kind="exit_code",
                    error=f"exited with code {outcome.returncode}: {outcome.tail()}",
                    exit_code=outcome.returncode,
                    duration_s=outcome.duration_s,
                )
            )
        return outcome.attach(
            AgentResult(outcome.stdout, exit_code=0, duration_s=outcome.duration_s)
        )
