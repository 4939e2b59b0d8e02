"""The Runner seam: one agent call in, one AgentResult out."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from phasegate.core.contract import VIOLATIONS, Violation
from phasegate.proc.sandbox import Confinement

__all__ = [
    "AgentRequest",
    "AgentResult",
    "ERROR_KINDS",
    "Runner",
    "VIOLATIONS",
    "Violation",
    "json_object",
]

#: Named reasons an agent call did not produce an answer.
ERROR_KINDS = (
    "exit_code",
    "max_turns",
    "budget",
    "model_error",
    "permission_denied",
    "timeout",
    "interrupted",
    "self_fenced",  # stopped at its lease's deadline: the worker could not renew it
    "invalid_patch",
    "read_only_violation",
    "ref_violation",
    "git_dir_violation",
    "runner_error",
    "oversized",  # an answer above limits.max_answer_bytes
    "secret_in_change",  # the graph's build answered with a diff holding a secret
)


def json_object(value: object) -> dict[str, Any]:
    """``value`` when it is a JSON object (a dict), else an empty one: how a runner
    reads a field its program may leave out or give another shape."""
    return value if isinstance(value, dict) else {}


@dataclass(frozen=True)
class AgentRequest:
    """One call of a role.

    - ``session_line``: main, review, verification or fresh (docs/contracts/lifecycle.md:
      session lines).
    - ``call_index``: how many calls of this role the workflow finished before
      this one; deterministic across restarts, so scripted answers replay.
    - ``timeout_s``: hard limit in seconds; the runner kills the agent after it.
    - ``read_only``: the role must not change files in ``cwd``.
    - ``state_dir``: the workflow's own directory for this runner's state (an
      isolated HOME, CODEX_HOME); it outlives the call, so sessions resume.
    - ``budget_usd``: what this call may spend at most, or None for no cap.
    - ``confinement``: how the runner confines the agent's process
      (``phasegate.proc.sandbox``); None runs it unconfined.
    - ``env``: variables every process of the call gets besides the runner's own
      (the worktree's ports, ``agents.ports``: PHASEGATE_PORT_BASE and
      PHASEGATE_PORT_COUNT); a runner that starts a process adds them.
    - ``on_output``: where the runner hands what its agent prints while it
      runs, ``on_output(stream, data)`` with stream "stdout" or "stderr" and the
      raw bytes (``agents.output.OutputLog.feed``: the live output);
      None: nobody watches. It returns at once and never raises; the answer is
      still the result's text.
    """

    workflow_id: str
    phase: str
    role: str
    session_line: str
    prompt: str
    cwd: Path
    timeout_s: float
    read_only: bool
    call_index: int = 0
    session_id: str | None = None
    state_dir: Path | None = None
    budget_usd: float | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    confinement: Confinement | None = None
    on_output: Callable[[str, bytes], None] | None = field(default=None, compare=False)


@dataclass(frozen=True)
class AgentResult:
    """What an agent call gave back. ``error_kind`` is one of ERROR_KINDS or None."""

    text: str
    error_kind: str | None = None
    error: str | None = None
    exit_code: int | None = None
    session_id: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    duration_s: float = 0.0
    violations: tuple[Violation, ...] = ()

    @property
    def ok(self) -> bool:
        return self.error_kind is None


class Runner(Protocol):
    """Drives one kind of agent. Must return (never raise) for agent failures,
    and return ``error_kind="interrupted"`` promptly once ``cancel`` is set."""

    name: str

    def run(
        self,
        request: AgentRequest,
        cancel: threading.Event,
        on_spawn: Callable[[int], None] | None = None,
    ) -> AgentResult:
        """Run the call. A runner that starts a process calls ``on_spawn(pid)`` with
        the leader of its process group, so a restarted worker can stop an agent
        its dead predecessor left running."""
        ...
