"""The ``gemini`` runner: Gemini CLI (``@google/gemini-cli``), non-interactive.

``gemini -p "" --output-format stream-json --approval-mode MODE`` with the
prompt on stdin (docs/agent-clis.md has what was checked, on 0.61.0):

- One session per session line, resumed across rounds with ``--resume ID``
  (the id is the stream's ``init`` event's); a session the CLI does not find
  (another checkout, a cleared HOME: exit code 42) is started afresh.
- Read-only roles run in approval mode ``default``: non-interactive, Gemini
  CLI does not even offer the tools that would ask (``write_file``,
  ``replace``, ``run_shell_command``, ``web_fetch``); the model's call of one
  fails ``tool_not_registered`` and the run is ``permission_denied``. (Its
  ``plan`` mode is read-only too, but a multi-phase planning workflow that
  waits for the user: not a reviewer's.) The build role runs ``yolo``.
- HOME is a directory of the workflow's own; phasegate's settings are its
  ``.gemini/settings.json``: the API-key auth (``selectedType:
  gemini-api-key``; with only ``GOOGLE_GEMINI_BASE_URL`` set the CLI picks a
  "gateway" auth it then refuses), no usage statistics, telemetry, update
  checks, session clean-up or IDE, no folder-trust prompt, the repository's ``.env`` not loaded,
  and the key variables kept from the commands the model runs
  (``environmentVariableRedaction``).
- For the build role the repository's own ``.gemini/settings.json`` is merged
  over them (Gemini CLI's workspace settings: the project's retries, MCP
  servers, hooks); a read-only role runs with ``GEMINI_CLI_TRUST_WORKSPACE=false``,
  so nothing in the checkout configures it (not even to allow a shell: a tool
  so allowed still asks, and is refused non-interactive), and the CLI itself
  caps an untrusted folder's approval mode at ``default``.
- The model: ``base_url`` becomes ``GOOGLE_GEMINI_BASE_URL``; the key is
  ``GEMINI_API_KEY``, copied from ``api_key_env`` when that names another
  variable. ``max_turns`` is ``model.maxSessionTurns`` (exit code 53).
- Tokens are the stream's ``result`` stats, for this process alone; a run
  killed before its result has its tokens read from what it appended to its
  session log (``HOME/.gemini/tmp/*/chats/*.jsonl``). Gemini CLI reports no
  cost: it is priced from ``input_usd_per_mtok``/``output_usd_per_mtok``.
- Error kinds: ``model_error`` (a failed model call: the result's status
  ``error``), ``max_turns``, ``permission_denied``, ``timeout``,
  ``exit_code``, ``runner_error``.
"""

from __future__ import annotations

import os
from typing import Any

from phasegate.agents.base import AgentRequest
from phasegate.agents.runners.gemini_family import GeminiFamilyRunner

__all__ = ["GeminiRunner", "SETTINGS"]

#: What every run gets, whatever the role (settings schema of Gemini CLI 0.61).
SETTINGS: dict[str, Any] = {
    "security": {
        "auth": {"selectedType": "gemini-api-key"},
        "folderTrust": {"enabled": False},
        "environmentVariableRedaction": {"enabled": True},
    },
    "general": {
        "enableAutoUpdate": False,
        "enableAutoUpdateNotification": False,
        # On by default (30 days): each start deletes, without waiting for it, the
        # session logs it judges expired or unusable. The HOME is the workflow's and
        # goes with it; a CI run lost a workflow's two sessions, and its second review
        # round started afresh.
        "sessionRetention": {"enabled": False},
    },
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
    "ide": {"enabled": False},
    "advanced": {"ignoreLocalEnv": True},
}


class GeminiRunner(GeminiFamilyRunner):
    name = "gemini"
    program = "gemini"

    def settings(self, request: AgentRequest) -> dict[str, Any]:
        settings = {key: dict(value) for key, value in SETTINGS.items()}
        if self.binding.max_turns:
            settings["model"] = {"maxSessionTurns": self.binding.max_turns}
        return settings

    def model_env(self) -> dict[str, str]:
        b = self.binding
        env: dict[str, str] = {}
        if b.base_url:
            env["GOOGLE_GEMINI_BASE_URL"] = b.base_url
        if b.api_key_env and b.api_key_env != "GEMINI_API_KEY" and b.api_key_env in os.environ:
            env["GEMINI_API_KEY"] = os.environ[b.api_key_env]
        return env
