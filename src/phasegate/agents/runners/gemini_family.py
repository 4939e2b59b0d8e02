"""What Gemini CLI and the CLIs forked from it (Qwen Code) share: a runner base class.

A program of this family runs non-interactive with its prompt on stdin and
``--output-format stream-json`` (``-o``), takes ``--approval-mode`` and
``--resume SESSION_ID``, keeps its settings and sessions under
``HOME/<config dir>``, merges the repository's own
``<config dir>/settings.json`` over them unless the workspace is not trusted
(Gemini CLI: an environment variable; Qwen Code: folder trust in the user
settings). ``GeminiFamilyRunner`` holds the run: an isolated HOME per
workflow, the settings written there, the workspace untrusted for a read-only
role, the resume and its fallback, the process, the stream parsed into an
AgentResult; a subclass names the program's settings, environment and stream
format (``phasegate.agents.runners.gemini``, ``phasegate.agents.runners.qwen``).

Gemini CLI's stream (0.61, ``StreamJsonFormatter``), one JSON object a line:

- ``{"type": "init", "session_id", "model"}`` first;
- ``{"type": "message", "role": "user"|"assistant", "content", "delta": true}``;
- ``{"type": "tool_use", "tool_name", "tool_id", "parameters"}`` and
  ``{"type": "tool_result", "tool_id", "status": "success"|"error", "output",
  "error": {"type", "message"}}``;
- ``{"type": "error", "severity", "message"}`` (a warning, or a turn limit);
- ``{"type": "result", "status": "success"|"error", "error": {"type",
  "message"}, "stats": {"input_tokens", "output_tokens", "total_tokens",
  "cached", ...}}`` last, also after a failed model call (with what was spent).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from phasegate.agents.base import AgentRequest, AgentResult, json_object
from phasegate.agents.cli_runner import CliRunner, Launch, appended, as_int, json_lines
from phasegate.agents.env import child_env
from phasegate.agents.mcp import gemini_servers
from phasegate.agents.process import ProcessOutcome

__all__ = ["GeminiFamilyRunner", "StreamSummary", "parse_stream", "transcript_tokens"]

#: Tool errors that mean the program refused the call (not offered, or denied by policy).
REFUSED_TOOL_ERRORS = frozenset({"tool_not_registered", "policy_violation"})
#: What a refused call that was offered (a setting allowed it) says, non-interactive.
_NEEDS_CONFIRMATION = "requires user confirmation"


@dataclass
class StreamSummary:
    """What a stream-json run said: the answer (the assistant's text since its last
    tool call), the session, the usage (tokens), how it ended and the tool calls
    refused. ``result`` is the closing event, None when the process printed none;
    ``failed`` and ``error_type``/``error_message`` are what it said of the end."""

    session_id: str | None = None
    text: str = ""
    result: dict[str, Any] | None = None
    failed: bool = False
    error_type: str = ""
    error_message: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    turn_limit: bool = False
    refused: list[str] = field(default_factory=list)


def parse_stream(stdout: str) -> StreamSummary:
    """Gemini CLI's ``-o stream-json`` output (the module docstring gives its events).

    Output tokens are ``total_tokens - input_tokens`` when larger than
    ``output_tokens``: the stream's ``output_tokens`` counts the candidates only,
    the thinking tokens (billed as output) only in the total."""
    summary = StreamSummary()
    tools: dict[str, str] = {}
    for event in json_lines(stdout):
        kind = event.get("type")
        if kind == "init":
            summary.session_id = event.get("session_id") or summary.session_id
        elif kind == "message" and event.get("role") == "assistant":
            summary.text += str(event.get("content") or "")
        elif kind == "tool_use":
            tools[str(event.get("tool_id"))] = str(event.get("tool_name"))
            summary.text = ""  # the answer is what follows the last tool call
        elif kind == "tool_result" and event.get("status") == "error":
            error = json_object(event.get("error"))
            said = str(error.get("message") or event.get("output") or "")
            if error.get("type") in REFUSED_TOOL_ERRORS or _NEEDS_CONFIRMATION in said:
                summary.refused.append(tools.get(str(event.get("tool_id")), "a tool"))
        elif kind == "error" and "turns" in str(event.get("message", "")).lower():
            summary.turn_limit = True
        elif kind == "result":
            summary.result = event
            error = json_object(event.get("error"))
            summary.failed = event.get("status") != "success"
            summary.error_type = str(error.get("type") or "")
            summary.error_message = str(error.get("message") or "")
            stats = json_object(event.get("stats"))
            summary.input_tokens = as_int(stats.get("input_tokens"))
            summary.output_tokens = max(
                as_int(stats.get("output_tokens")),
                as_int(stats.get("total_tokens")) - summary.input_tokens,
            )
    return summary


def transcript_tokens(text: str) -> tuple[int, int]:
    """Input and output tokens of the model messages in session-log lines ``text``
    (``{"id", "type": "gemini", "tokens": {"input", "total", ...}}``; a message is
    written again as it grows, so the last line of each id counts)."""
    by_id: dict[str, tuple[int, int]] = {}
    for line in text.splitlines():
        if '"tokens"' not in line:
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by a killed process
        tokens = record.get("tokens") if isinstance(record, dict) else None
        if not isinstance(tokens, dict):
            continue
        used = as_int(tokens.get("input"))
        out = max(as_int(tokens.get("output")) + as_int(tokens.get("thoughts")), 0)
        out = max(out, as_int(tokens.get("total")) - used)
        by_id[str(record.get("id"))] = (used, out)
    return sum(t[0] for t in by_id.values()), sum(t[1] for t in by_id.values())


class GeminiFamilyRunner(CliRunner):
    """A runner for a CLI of Gemini CLI's family. Subclasses set the class
    attributes and ``settings``/``model_env``; ``parse`` may be overridden for a
    fork whose stream differs."""

    name = "gemini-family"
    #: The program started when the binding names no ``executable``.
    program = "gemini"
    #: The program's directory under HOME (settings, sessions, logs).
    config_dir = ".gemini"
    #: The variable that, "false", makes it ignore the repository's settings, hooks
    #: and MCP servers (its system-settings variable is no way: that file is skipped
    #: when a directory above it is writable by others, as /tmp is); None for a
    #: program whose settings say it (``settings`` then does).
    trust_var: str | None = "GEMINI_CLI_TRUST_WORKSPACE"
    #: Where the session logs are under ``HOME/config_dir``.
    chats_glob = "tmp/*/chats/*.jsonl"
    #: Its exit code, and a phrase on stderr, when ``--resume`` names no session it has.
    resume_failed = (42, "Error resuming session")
    #: Its exit code at the configured turn limit.
    turn_limit_exit = 53
    #: Its approval modes: a read-only role's (edits and shell not even offered
    #: in a non-interactive run) and the build role's (every tool without asking).
    read_only_mode = "default"
    write_mode = "yolo"

    # -- what a subclass says ------------------------------------------------------

    def settings(self, request: AgentRequest) -> dict[str, Any]:
        """The program's user settings for ``request`` (``HOME/config_dir/settings.json``)."""
        raise NotImplementedError

    def model_env(self) -> dict[str, str]:
        """The variables that point the program at its model (base URL, key)."""
        raise NotImplementedError

    def parse(self, stdout: str) -> StreamSummary:
        return parse_stream(stdout)

    def mcp_setting(self) -> dict[str, Any]:
        """The ``mcpServers`` setting of the binding's MCP servers (``phasegate.agents.mcp``)."""
        return gemini_servers(self.binding.mcp_servers)

    @contextmanager
    def call_env(self, request: AgentRequest, extra: dict[str, str]) -> Iterator[dict[str, str]]:
        """The environment of one call (``extra``: what the run sets, HOME...); a
        subclass may leave files for the call and remove them after it."""
        yield child_env(self.binding, extra={**extra, **self.model_env()})

    def spent(self, stdout: str, transcript: str) -> tuple[int, int]:
        """Input and output tokens of a run killed before its result: its stdout so
        far, and what it appended to its session logs (``transcript``)."""
        return transcript_tokens(transcript)

    # -- the run -----------------------------------------------------------------

    #: What makes it run once, non-interactive, with the prompt on stdin: -p ""
    #: (the prompt is stdin, never an argument).
    prompt_args: tuple[str, ...] = ("-p", "")

    def argv(self, request: AgentRequest, *, resume: bool = True) -> list[str]:
        b = self.binding
        mode = self.read_only_mode if request.read_only else self.write_mode
        args = [
            self.executable(),
            *self.prompt_args,
            "--output-format",
            "stream-json",
            "--approval-mode",
            mode,
        ]
        if b.model:
            args += ["--model", b.model]
        if resume and request.session_id:
            args += ["--resume", request.session_id]
        return [*args, *b.extra_args]

    def config(self, request: AgentRequest) -> Path:
        """The program's directory under its HOME: settings, sessions, logs."""
        return self.home(request) / self.config_dir

    @contextmanager
    def prepare(self, request: AgentRequest) -> Iterator[dict[str, str]]:
        config = self.config(request)
        config.mkdir(parents=True, exist_ok=True)
        settings = self.settings(request)
        if self.binding.mcp_servers:
            settings["mcpServers"] = self.mcp_setting()
        (config / "settings.json").write_text(json.dumps(settings, indent=2), encoding="utf-8")
        (config / "settings.json").chmod(0o600)  # an MCP server's env may hold a key
        extra = {"HOME": str(self.home(request))}
        if request.read_only and self.trust_var:
            # What the build may have written into the checkout (a .gemini/settings.json
            # allowing the shell, hooks, MCP servers) does not configure a reviewer.
            extra[self.trust_var] = "false"
        with self.call_env(request, extra) as env:
            yield env

    def launch(self, request: AgentRequest, env: dict[str, str], *, resume: bool) -> Launch:
        # Its tools' output is in its session logs, not in the stream.
        transcript = appended(self.config(request), self.chats_glob)
        return Launch(self.argv(request, resume=resume), transcript=transcript)

    def session_gone(self, result: AgentResult) -> bool:
        code, phrase = self.resume_failed
        return result.exit_code == code and phrase in (result.error or "")

    def stopped(
        self, failure: AgentResult, outcome: ProcessOutcome, request: AgentRequest, launch: Launch
    ) -> AgentResult:
        # Killed mid-run: what its answered turns cost is in the session log.
        assert launch.transcript is not None
        spent = self.spent(outcome.stdout, launch.transcript())
        summary = self.parse(outcome.stdout)
        return replace(failure, session_id=summary.session_id, **self.priced(*spent))

    def finished(
        self, outcome: ProcessOutcome, request: AgentRequest, launch: Launch
    ) -> AgentResult:
        return self.result(outcome, request)

    def result(self, outcome: ProcessOutcome, request: AgentRequest) -> AgentResult:
        """The AgentResult of a process that ended on its own."""
        s = self.parse(outcome.stdout)
        fields: dict[str, Any] = {
            "exit_code": outcome.returncode,
            "session_id": s.session_id,
            "duration_s": outcome.duration_s,
            **self.priced(s.input_tokens, s.output_tokens),
        }
        program = self.name
        said = (s.error_message if s.result is not None else outcome.tail())[:500]
        limited = s.turn_limit or "TurnLimited" in s.error_type
        if outcome.returncode == self.turn_limit_exit or limited:
            # Before the missing result: Qwen Code prints none at its turn limit.
            return AgentResult(
                s.text, error_kind="max_turns", error=f"stopped at the turn limit: {said}", **fields
            )
        if s.result is None:
            kind = "exit_code" if outcome.returncode else "model_error"
            error = f"no result from {program} (exit code {outcome.returncode}): {outcome.tail()}"
            return AgentResult(s.text, error_kind=kind, error=error, **fields)
        model_error = None
        if s.failed:
            model_error = f"{program} error ({s.error_type or 'unknown'}): {said}"
        return outcome.ended(s.text, fields, model_error=model_error, refused=s.refused)
