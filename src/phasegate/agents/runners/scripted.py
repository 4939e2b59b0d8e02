"""The ``scripted`` runner: answers per role, read from a TOML file or given as data.

The fake runner for tests and the demo, shipped with the package. An answer is
a table with ``text`` and optionally:

- ``files``: path → content, written in the worktree (build roles only);
- ``patch``: a unified diff, applied in the worktree like a build agent would;
- ``exit_code``: non-zero makes the call fail like an agent that crashed;
- ``output``: what it prints while it works, handed to ``on_output`` (the
  live output) before its sleep, as an agent's stdout would be;
- ``sleep``: seconds to wait first; ``hang = true`` waits past any timeout;
- ``input_tokens``, ``output_tokens``, ``cost_usd``: the usage to report.

The answer for a call is ``answers[role][call_index]``; the last one repeats.
``call_index`` counts the role's finished calls in the workflow, so a restarted
workflow gets the same answers it would have got without the restart.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any, TypedDict

from phasegate.agents.base import AgentRequest, AgentResult
from phasegate.config.toml import TomlError, read_toml
from phasegate.core.contract import PhasegateError
from phasegate.git.workspace import PatchError, Workspace

__all__ = ["ScriptedRunner", "load_answers"]

_ANSWER_KEYS = frozenset(
    {
        "text",
        "files",
        "patch",
        "exit_code",
        "output",
        "sleep",
        "hang",
        "input_tokens",
        "output_tokens",
        "cost_usd",
    }
)


def load_answers(path: Path) -> dict[str, list[dict[str, Any]]]:
    """Read a scripted-answers TOML file. Raises PhasegateError naming the bad key."""
    try:
        raw = read_toml(path)
    except TomlError as exc:
        what = str(exc).removeprefix(f"{path}: ")
        raise PhasegateError(f"{path}: cannot read scripted answers: {what}") from None
    for role, answers in raw.items():
        if not isinstance(answers, list):
            raise PhasegateError(f"{path}: {role}: expected an array of tables [[{role}]]")
        for i, answer in enumerate(answers):
            unknown = set(answer) - _ANSWER_KEYS
            if unknown:
                raise PhasegateError(f"{path}: {role}[{i}]: unknown key {sorted(unknown)[0]!r}")
    return raw


class _Usage(TypedDict):
    """What an answer says it used, as AgentResult's fields of the same names."""

    input_tokens: int
    output_tokens: int
    cost_usd: float


class ScriptedRunner:
    name = "scripted"

    def __init__(self, answers: Mapping[str, Sequence[Mapping[str, Any]]]) -> None:
        self.answers = answers

    @classmethod
    def from_file(cls, path: Path) -> ScriptedRunner:
        return cls(load_answers(path))

    def run(
        self,
        request: AgentRequest,
        cancel: threading.Event,
        on_spawn: Callable[[int], None] | None = None,
    ) -> AgentResult:
        started = time.monotonic()
        answers = self.answers.get(request.role)
        if not answers:
            return AgentResult(
                "",
                error_kind="runner_error",
                error=f"no scripted answers for role {request.role!r}",
            )
        answer = answers[min(request.call_index, len(answers) - 1)]
        if answer.get("output") and request.on_output is not None:
            request.on_output("stdout", str(answer["output"]).encode("utf-8"))
        wait_s = float("inf") if answer.get("hang") else float(answer.get("sleep", 0))
        deadline = started + request.timeout_s
        while time.monotonic() < started + wait_s:
            if cancel.wait(0.05):
                return AgentResult(
                    "",
                    error_kind="interrupted",
                    error="stopped by shutdown",
                    duration_s=time.monotonic() - started,
                )
            if time.monotonic() >= deadline:
                return AgentResult(
                    "",
                    error_kind="timeout",
                    error=f"no answer within {request.timeout_s:g}s; killed",
                    duration_s=time.monotonic() - started,
                )
        usage: _Usage = {
            "input_tokens": int(answer.get("input_tokens", 0)),
            "output_tokens": int(answer.get("output_tokens", 0)),
            "cost_usd": float(answer.get("cost_usd", 0.0)),
        }
        exit_code = int(answer.get("exit_code", 0))
        if exit_code:
            return AgentResult(
                str(answer.get("text", "")),
                error_kind="exit_code",
                error=f"exited with code {exit_code}",
                exit_code=exit_code,
                duration_s=time.monotonic() - started,
                **usage,
            )
        if not request.read_only:
            try:
                self._write(request.cwd, answer)
            except PatchError as exc:
                return AgentResult(
                    "",
                    error_kind="invalid_patch",
                    error=str(exc),
                    duration_s=time.monotonic() - started,
                    **usage,
                )
        return AgentResult(
            str(answer.get("text", "")), exit_code=0, duration_s=time.monotonic() - started, **usage
        )

    @staticmethod
    def _write(cwd: Path, answer: Mapping[str, Any]) -> None:
        for name, content in dict(answer.get("files", {})).items():
            pure = PurePosixPath(name)
            if pure.is_absolute() or ".." in pure.parts:
                raise PatchError(f"scripted file reaches outside its worktree: {name}")
            target = cwd / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content, encoding="utf-8")
        if answer.get("patch"):
            Workspace().apply_patch(cwd, str(answer["patch"]))
