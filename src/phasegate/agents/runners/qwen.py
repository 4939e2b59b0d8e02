"""The ``qwen`` runner: Qwen Code (``@qwen-code/qwen-code``), non-interactive.

``qwen --output-format stream-json --approval-mode MODE`` with the prompt on
stdin (docs/agent-clis.md has what was checked, on 0.24.4). Qwen Code is a
fork of Gemini CLI (``phasegate.agents.runners.gemini_family``); where it differs:

- The prompt is stdin alone: its ``-p`` is deprecated, and appends its value
  to stdin.
- One session per session line, resumed with ``--resume ID`` (the id is the
  ``system``/``init`` event's); a session it does not have (exit code 1,
  "No saved session found") is started afresh.
- Read-only roles run in approval mode ``default``: non-interactive, Qwen
  Code does not offer ``write_file``, ``edit`` or ``run_shell_command`` and
  declines a call of one (or of ``agent``, a sub-agent) as needing a
  permission it cannot ask for; the result lists it in
  ``permission_denials`` and the run is ``permission_denied``. The build
  role runs ``yolo``.
- No variable makes it distrust the workspace: for a read-only role the user
  settings turn folder trust on (``security.folderTrust.enabled``) and the
  isolated HOME trusts no folder, so the checkout's ``.qwen/settings.json``
  (its permissions, hooks, MCP servers) and ``.env`` are not read. For the
  build role folder trust is off and they are, as Qwen Code's workspace
  settings, under the user's and system's.
- The model is an OpenAI-compatible server: ``base_url`` (with ``/v1``, as
  for the api runner) and the key go in a system settings file of the
  call's own (``QWEN_CODE_SYSTEM_SETTINGS_PATH``, ``security.auth``: above
  the workspace's settings, removed after the call), not in the environment,
  which the commands its shell tool runs inherit. The key is the variable
  ``api_key_env`` names, else an ``OPENAI_API_KEY`` the binding's ``env``
  sets. ``model`` is required (``--model``); ``max_turns`` is
  ``model.maxSessionTurns`` (exit code 53, and no result event).
- Its managed auto-memory (a model call after every run, with edit and shell
  tools, whatever the approval mode), auto-update, usage statistics and
  telemetry are off; ``QWEN_CODE_NO_RELAUNCH`` keeps it one process (it
  re-executes itself otherwise: twice the start-up, about 3 s).
- Tokens: the sum of the ``usage`` of its ``assistant`` events, one per model
  response (a response's text and tool calls may come as two events, the
  usage on the last). The ``result`` event's usage is the whole session's,
  earlier rounds' too, on a resumed session. Qwen Code reports no cost: it
  is priced from ``input_usd_per_mtok``/``output_usd_per_mtok``.
- Error kinds: ``model_error`` (``result`` with ``is_error``: a failed model
  call, after its own retries; a 5xx is tried 7 times with backoff, which no
  setting changes), ``max_turns``, ``permission_denied``, ``timeout``,
  ``exit_code``, ``runner_error``.

Qwen Code's stream (0.24.4, ``StreamJsonOutputAdapter``) is Claude Code's
shape, not Gemini CLI's; one JSON object a line:

- ``{"type": "system", "subtype": "init", "session_id", "model", "tools", ...}``;
- ``{"type": "assistant", "session_id", "parent_tool_use_id", "message":
  {"content": [{"type": "text", "text"} | {"type": "tool_use", "id", "name",
  "input"}], "usage": {"input_tokens", "output_tokens", "total_tokens"}}}``
  (``parent_tool_use_id`` set: a sub-agent's);
- ``{"type": "user", "message": {"content": [{"type": "tool_result",
  "tool_use_id", "is_error", "content"}]}}``;
- ``{"type": "stream_event", ...}`` (goal state; ignored);
- ``{"type": "result", "subtype": "success"|"error_during_execution",
  "is_error", "result", "usage", "permission_denials": [{"tool_name",
  "tool_use_id", "tool_input"}], "error": {"message"}}`` last, also after a
  failed model call.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from phasegate.agents.base import AgentRequest, json_object
from phasegate.agents.cli_runner import as_int, json_lines, write_secret
from phasegate.agents.env import child_env
from phasegate.agents.runners.gemini_family import GeminiFamilyRunner, StreamSummary

__all__ = ["QwenRunner", "SETTINGS", "parse_qwen_stream"]

#: What every run gets, whatever the role (settings schema of Qwen Code 0.24.4).
SETTINGS: dict[str, Any] = {
    "memory": {"enableManagedAutoMemory": False, "enableManagedAutoDream": False},
    "general": {"enableAutoUpdate": False},
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
    "ide": {"enabled": False},
}

#: What a tool call's result says when Qwen Code refused it rather than ran it.
_REFUSALS = ("requires permission to use", "[tool_call bridge refused]")


def _blocks(event: dict[str, Any]) -> list[dict[str, Any]]:
    message = json_object(event.get("message"))
    content = message.get("content")
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def parse_qwen_stream(stdout: str) -> StreamSummary:
    """Qwen Code's ``-o stream-json`` output (the module docstring gives its events).

    The answer is the main agent's text since its last tool call (the result's
    ``result`` when there is none); output tokens are ``total_tokens -
    input_tokens`` when larger than ``output_tokens`` (thinking tokens)."""
    summary = StreamSummary()
    tools: dict[str, str] = {}
    for event in json_lines(stdout):
        summary.session_id = event.get("session_id") or summary.session_id
        kind = event.get("type")
        main = event.get("parent_tool_use_id") is None
        if kind == "assistant":
            message = json_object(event.get("message"))
            usage = json_object(message.get("usage"))
            used = as_int(usage.get("input_tokens"))
            summary.input_tokens += used
            summary.output_tokens += max(
                as_int(usage.get("output_tokens")), as_int(usage.get("total_tokens")) - used
            )
            for block in _blocks(event):
                if block.get("type") == "tool_use":
                    name = str(block.get("name"))
                    given = json_object(block.get("input"))
                    if name == "tool_call" and given.get("name"):
                        name = str(given["name"])  # the deferred tool it calls
                    tools[str(block.get("id"))] = name
                    if main:
                        summary.text = ""  # the answer is what follows the last tool call
                elif block.get("type") == "text" and main:
                    summary.text += str(block.get("text") or "")
        elif kind == "user":
            for block in _blocks(event):
                said = str(block.get("content") or "")
                if block.get("is_error") and any(r in said for r in _REFUSALS):
                    summary.refused.append(tools.get(str(block.get("tool_use_id")), "a tool"))
        elif kind == "result":
            summary.result = event
            summary.failed = bool(event.get("is_error"))
            error = json_object(event.get("error"))
            summary.error_type = str(event.get("subtype") or "")
            summary.error_message = str(error.get("message") or "")
            denied = event.get("permission_denials")
            for denial in denied if isinstance(denied, list) else []:
                if isinstance(denial, dict) and denial.get("tool_name"):
                    summary.refused.append(str(denial["tool_name"]))
            if not summary.text and isinstance(event.get("result"), str):
                summary.text = event["result"]
    return summary


class QwenRunner(GeminiFamilyRunner):
    name = "qwen"
    program = "qwen"
    config_dir = ".qwen"
    trust_var = None  # folder trust is a setting: ``settings``
    chats_glob = "projects/*/chats/*.jsonl"
    resume_failed = (1, "No saved session found")
    turn_limit_exit = 53
    prompt_args = ()

    def settings(self, request: AgentRequest) -> dict[str, Any]:
        settings = {key: dict(value) for key, value in SETTINGS.items()}
        # On, with no folder trusted in this HOME: the checkout is untrusted and its
        # .qwen/settings.json and .env are not read. Off: every folder is trusted.
        settings["security"] = {"folderTrust": {"enabled": request.read_only}}
        if self.binding.max_turns:
            settings["model"] = {"maxSessionTurns": self.binding.max_turns}
        return settings

    def model_env(self) -> dict[str, str]:
        env = {
            # One process, not a launcher and its re-executed copy.
            "QWEN_CODE_NO_RELAUNCH": "true",
            # phasegate confines the build itself; the notice would be the stderr tail.
            "QWEN_CODE_SUPPRESS_YOLO_WARNING": "1",
        }
        if self.binding.mcp_servers:
            # 0.24 discovers MCP servers in the background, and a -p run's first model
            # request goes without their tools; blocking, it waits for them.
            env["QWEN_CODE_LEGACY_MCP_BLOCKING"] = "1"
        return env

    def parse(self, stdout: str) -> StreamSummary:
        return parse_qwen_stream(stdout)

    def mcp_setting(self) -> dict[str, Any]:
        # 0.24 offers an MCP server's tools only through its tool_search tool unless
        # the server's are always loaded: a model would have to search for them first.
        return {
            name: {**entry, "alwaysLoadTools": True}
            for name, entry in super().mcp_setting().items()
        }

    def spent(self, stdout: str, transcript: str) -> tuple[int, int]:
        # Each answered model call's usage was printed as it came.
        summary = self.parse(stdout)
        return summary.input_tokens, summary.output_tokens

    def auth_settings(self, key: str | None) -> dict[str, Any]:
        """The system settings of a call: the OpenAI-compatible auth, its base URL
        and ``key`` (the system scope is above the workspace's settings)."""
        auth: dict[str, Any] = {"selectedType": "openai"}
        if key:
            auth["apiKey"] = key
        settings: dict[str, Any] = {"security": {"auth": auth}}
        if self.binding.base_url:
            auth["baseUrl"] = self.binding.base_url
            settings["model"] = {"baseUrl": self.binding.base_url}
        return settings

    @contextmanager
    def call_env(self, request: AgentRequest, extra: dict[str, str]) -> Iterator[dict[str, str]]:
        assert request.state_dir is not None  # run() refuses a request without one
        b = self.binding
        env = child_env(b, extra={**extra, **self.model_env()})
        key = env.pop(b.api_key_env, None) if b.api_key_env else None
        key = key or env.pop("OPENAI_API_KEY", None)
        env.pop("OPENAI_API_KEY", None)  # out of the environment its commands inherit
        call_dir = Path(tempfile.mkdtemp(prefix="qwen-call-", dir=request.state_dir))
        try:
            path = call_dir / "system-settings.json"
            write_secret(path, json.dumps(self.auth_settings(key)))
            # Also keeps a machine's /etc/qwen-code/settings.json out of the call.
            env["QWEN_CODE_SYSTEM_SETTINGS_PATH"] = str(path)
            yield env
        finally:
            shutil.rmtree(call_dir, ignore_errors=True)  # the key with it
