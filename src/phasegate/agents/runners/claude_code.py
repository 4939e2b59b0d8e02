"""The ``claude-code`` runner: the Claude Code CLI, non-interactive (``claude -p``).

- The prompt goes on stdin; ``--output-format json`` gives one result object:
  text, session id, usage, cost in USD, and how the run ended.
- One provider session per session line, resumed across rounds with
  ``--resume`` (the engine keeps the id; a session the CLI no longer knows is
  started afresh).
- Read-only roles may read and search, nothing else (no shell); the build
  role may also edit and run commands (``acceptEdits`` with Bash allowed:
  ``bypassPermissions`` refuses to run as root).
- A refused tool call exits 0 with ``is_error: false``; it is only in
  ``permission_denials``, and a run with any is a failed run, never a success.
- Tokens come from ``usage``, unless ``modelUsage`` (per model: ``inputTokens``,
  ``outputTokens``, ``cacheReadInputTokens``, ``cacheCreationInputTokens``, for
  this process's requests, the ones ``total_cost_usd`` prices) counts more: a
  run stopped by its budget (``error_max_budget_usd``) leaves ``usage`` empty or
  without its last turns.
- HOME is a directory of the workflow's own (the CLI writes its sessions and
  settings there); the environment holds only what the role binding names.
- Writes the sandbox refused are read from what the call appended to its
  session transcripts (``HOME/.claude/projects/*/*.jsonl``, where its tools'
  output is): ``sandbox_denied`` violations.
- Error kinds: ``max_turns``, ``budget``, ``model_error``,
  ``permission_denied``, ``timeout``, ``exit_code``, ``runner_error``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from phasegate.agents.base import AgentRequest, AgentResult
from phasegate.agents.cli_runner import CliRunner, Launch, appended, as_int
from phasegate.agents.env import child_env
from phasegate.agents.mcp import claude_allowed_tools, claude_config
from phasegate.agents.process import ProcessOutcome

__all__ = ["ClaudeCodeRunner", "parse_result"]

#: No shell for a read-only role: even ``git diff --output=FILE`` writes anywhere.
#: The diff and the checks' results are in its prompt.
READ_ONLY_TOOLS = ("Read", "Grep", "Glob")
WRITE_TOOLS = ("Read", "Grep", "Glob", "Write", "Edit", "MultiEdit", "NotebookEdit", "Bash")
_NO_WRITES = "Write,Edit,MultiEdit,NotebookEdit,Bash"


def _last_json_object(stdout: str) -> dict[str, Any] | None:
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict):
                return value
    return None


def _tokens(data: dict[str, Any]) -> tuple[int, int]:
    """Input (cache reads and writes included) and output tokens of a result object.

    ``usage`` is the main loop's; ``modelUsage`` sums every request of the process
    by model. They agree on a finished run; on a budget stop ``usage`` is empty or
    misses the last turns, so the larger count wins.
    """
    usage = data.get("usage")
    usage = usage if isinstance(usage, dict) else {}
    from_usage = (
        as_int(usage.get("input_tokens"))
        + as_int(usage.get("cache_creation_input_tokens"))
        + as_int(usage.get("cache_read_input_tokens")),
        as_int(usage.get("output_tokens")),
    )
    models = data.get("modelUsage")
    models = [m for m in models.values() if isinstance(m, dict)] if isinstance(models, dict) else []
    from_models = (
        sum(
            as_int(m.get("inputTokens"))
            + as_int(m.get("cacheReadInputTokens"))
            + as_int(m.get("cacheCreationInputTokens"))
            for m in models
        ),
        sum(as_int(m.get("outputTokens")) for m in models),
    )
    return from_models if sum(from_models) > sum(from_usage) else from_usage


def parse_result(outcome: ProcessOutcome) -> AgentResult:
    """The AgentResult of a finished ``claude -p --output-format json`` process."""
    data = _last_json_object(outcome.stdout)
    if data is None:
        kind = "exit_code" if outcome.returncode else "model_error"
        return AgentResult(
            outcome.stdout,
            error_kind=kind,
            error=f"no result from claude (exit code {outcome.returncode}): {outcome.tail()}",
            exit_code=outcome.returncode,
            duration_s=outcome.duration_s,
        )
    input_tokens, output_tokens = _tokens(data)
    fields: dict[str, Any] = {
        "exit_code": outcome.returncode,
        "session_id": data.get("session_id"),
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cost_usd": float(data.get("total_cost_usd") or 0.0),
        "duration_s": outcome.duration_s,
    }
    text = str(data.get("result") or "")
    subtype = data.get("subtype")
    denials = data.get("permission_denials") or []
    if subtype == "error_max_turns":
        return AgentResult(
            text,
            error_kind="max_turns",
            error=f"stopped at the turn limit after {data.get('num_turns')} turns",
            **fields,
        )
    if subtype == "error_max_budget_usd":
        return AgentResult(
            text,
            error_kind="budget",
            error=f"stopped at the call's budget (spent ${fields['cost_usd']:.4f})",
            **fields,
        )
    model_error = None
    if data.get("is_error") or str(subtype or "").startswith("error"):
        status = data.get("api_error_status")
        where = f"model API error {status}" if status else f"claude error ({subtype})"
        model_error = f"{where}: {text[:500]}"
    refused = [str(d.get("tool_name")) for d in denials]
    return outcome.ended(text, fields, model_error=model_error, refused=refused)


#: The binding's MCP servers for ``--mcp-config``, in the workflow's state dir.
MCP_CONFIG = "claude-mcp.json"


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only (a server's env may hold a key)."""
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)
    path.write_text(text, encoding="utf-8")


class ClaudeCodeRunner(CliRunner):
    name = "claude-code"
    program = "claude"
    home_dir = "claude-home"

    def argv(self, request: AgentRequest, *, resume: bool = True) -> list[str]:
        b = self.binding
        args = [self.executable(), "-p", "--output-format", "json"]
        if request.read_only:
            tools = [*(b.allowed_tools or READ_ONLY_TOOLS), *claude_allowed_tools(b.mcp_servers)]
            args += [
                "--permission-mode",
                "default",
                "--allowedTools",
                ",".join(tools),
                "--disallowedTools",
                _NO_WRITES,
            ]
        else:
            tools = [*(b.allowed_tools or WRITE_TOOLS), *claude_allowed_tools(b.mcp_servers)]
            args += ["--permission-mode", "acceptEdits", "--allowedTools", ",".join(tools)]
        if b.model:
            args += ["--model", b.model]
        if b.max_turns:
            args += ["--max-turns", str(b.max_turns)]
        if request.budget_usd is not None:
            args += ["--max-budget-usd", f"{max(request.budget_usd, 0.0001):.4f}"]
        if b.append_system_prompt:
            args += ["--append-system-prompt", b.append_system_prompt]
        if b.mcp_servers and request.state_dir is not None:
            # Only the binding's servers: none of the repository's .mcp.json or the user's.
            mcp = request.state_dir / MCP_CONFIG
            args += ["--mcp-config", str(mcp), "--strict-mcp-config"]
        if resume and request.session_id:
            args += ["--resume", request.session_id]
        return [*args, *b.extra_args]

    @contextmanager
    def prepare(self, request: AgentRequest) -> Iterator[dict[str, str]]:
        assert request.state_dir is not None  # run() refuses a request without one
        extra = {
            "HOME": str(self.home(request)),
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
        }
        if self.binding.base_url:
            extra["ANTHROPIC_BASE_URL"] = self.binding.base_url
        if self.binding.mcp_servers:
            write_private(
                request.state_dir / MCP_CONFIG, json.dumps(claude_config(self.binding.mcp_servers))
            )
            # -p connects MCP servers in the background: a server slower than the first
            # model request would miss it. Blocking, the first request has their tools.
            extra["MCP_CONNECTION_NONBLOCKING"] = "0"
        yield child_env(self.binding, extra=extra)

    def launch(self, request: AgentRequest, env: dict[str, str], *, resume: bool) -> Launch:
        return Launch(
            self.argv(request, resume=resume),
            # Its tools' output is in its session transcripts, not in the JSON result.
            transcript=appended(Path(env["HOME"]) / ".claude" / "projects", "*/*.jsonl"),
        )

    def finished(
        self, outcome: ProcessOutcome, request: AgentRequest, launch: Launch
    ) -> AgentResult:
        return parse_result(outcome)

    def session_gone(self, result: AgentResult) -> bool:
        return "No conversation found" in (result.error or result.text)
