"""The ``opencode`` runner: the opencode CLI, non-interactive (``opencode run --format json``).

Facts about the CLI (npm ``opencode-ai`` 1.18.33, a native binary in an optional
dependency; checked offline against ``phasegate.testing.model_server``, see
docs/agent-clis.md):

- ``opencode run --format json`` reads the prompt from stdin (no argv length
  limit) and prints one JSON object a line: ``step_start``, ``text``,
  ``tool_use``, ``step_finish`` (``part.tokens``: ``input`` without the cache
  reads and writes, ``output`` without the reasoning, ``reasoning``,
  ``cache.read``/``cache.write``; ``part.cost`` in USD, from the model's
  configured price) and ``error`` (``error.name``, ``error.data.message``,
  ``error.data.statusCode``); every event carries the ``sessionID``.
  A failed run exits 1 after its ``error`` event.
- ``--session ID`` continues a session (stored in its SQLite database under
  ``XDG_DATA_HOME/opencode``); an unknown one exits 1 with "Session not found"
  on stderr. ``--title`` names the session, which saves the extra model call
  that would write a title (a call whose usage no event reports).
- A model error is retried by opencode itself, 5 times, 2 s to 30 s apart
  (a ``Retry-After``/``Retry-After-Ms`` header sets the wait); not configurable.
- Permissions (``permission`` in its config: ``allow``/``ask``/``deny`` per
  tool, ``"*"`` for all, the last matching rule wins): a denied tool is left
  out of the tools the model is offered; a call of it, or of one ``ask``
  leaves to a person (``run`` refuses those: "auto-rejecting"), is a tool
  part with ``state.status = "error"``. The run still exits 0.
- The ``task`` tool runs a subagent in a session of its own, whose usage no
  event of this run reports: it is denied to every role, so every model call
  is counted.
- Config: ``OPENCODE_CONFIG_CONTENT`` (inline JSON) is merged over the global
  and the project's config, and ``OPENCODE_PERMISSION`` over everything; the
  project's ``opencode.json``/``AGENTS.md`` are still read. An
  ``@ai-sdk/openai-compatible`` provider is bundled in the binary (nothing is
  fetched at run time); the only network use besides the model is a
  background ``npm install`` of its plugin package into the config dir, whose
  failure offline is a logged warning.

How phasegate drives it:

- HOME and the XDG dirs are the workflow's own (``state_dir/opencode-home``):
  it reads no person's config and keeps its sessions there; autoupdate,
  sharing, the models.dev fetch, LSP downloads and its own git snapshots of
  the worktree are off.
- With ``base_url``, ``model`` is the server's model id, reached through an
  OpenAI-compatible provider ``phasegate`` (its chat completions, with
  ``/v1`` in the URL as for the api runner); the binding's prices become the
  model's price, so opencode reports the cost. Without, ``model`` is
  opencode's ``provider/model`` and its provider reads its own key variable.
- The key (``api_key_env``) reaches opencode through a file of the call's
  own (``{file:...}`` in the config, removed after the call), not its
  environment: the commands its bash tool runs inherit that environment.
- Every call runs as the agent ``phasegate`` the inline config defines
  (``--agent``), with the role's permission: an agent's own permission wins
  over the top-level one, and a project's ``.opencode/agents/build.md`` (or
  ``default_agent``) allowing edits did let the default agent write in a
  read-only role. Read-only roles may read, grep and glob, nothing else; the
  build role may edit and run commands; ``task`` is denied to both and so are paths outside
  the worktree (``external_directory``). A refused tool call fails the call
  (``permission_denied``), as it does for claude-code.
- Cost is what opencode reports; a call it reports none for is priced from
  the binding's ``input_usd_per_mtok``/``output_usd_per_mtok``.
- opencode writes a ``"$schema"`` line into each project config file
  (``opencode.json``, ``.opencode/opencode.json``) that has none, at every
  start, in read-only roles too; the runner puts such a file back as it was
  when that line is the only change.
- Error kinds: ``model_error``, ``permission_denied``, ``timeout``,
  ``exit_code``, ``runner_error``.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from phasegate.agents.base import AgentRequest, AgentResult, json_object
from phasegate.agents.cli_runner import CliRunner, Launch, as_int, json_lines, write_secret
from phasegate.agents.env import child_env
from phasegate.agents.mcp import opencode_servers
from phasegate.agents.process import ProcessOutcome

__all__ = ["BUILD_PERMISSION", "OpencodeRunner", "READ_ONLY_PERMISSION", "parse_events"]

#: The provider id phasegate gives a ``base_url``.
PROVIDER = "phasegate"

#: The agent every call runs as, defined in the inline config: an agent's own
#: ``permission`` wins over the top-level one, and a project may define (or make
#: ``default_agent``) one that allows edits.
AGENT = "phasegate"

# Every tool opencode 1.18 has that writes, runs or delegates, named so that a
# project's rule for one of them is overridden in place (the last matching rule wins).
_NOT_READ_ONLY = (
    "edit",
    "write",
    "patch",
    "bash",
    "task",
    "webfetch",
    "websearch",
    "codesearch",
    "todowrite",
    "skill",
    "lsp",
    "question",
    "external_directory",
    "doom_loop",
)

#: A read-only role: read, grep and glob in the worktree; nothing else.
READ_ONLY_PERMISSION: dict[str, str] = {
    "*": "deny",
    **dict.fromkeys(_NOT_READ_ONLY, "deny"),
    **dict.fromkeys(("read", "grep", "glob", "list"), "allow"),
}

#: The build role: edits and commands in the worktree; no subagent (its usage
#: would go unreported), no path outside the worktree, nobody to ask.
BUILD_PERMISSION: dict[str, str] = {
    "*": "allow",
    **dict.fromkeys(("task", "external_directory", "question", "doom_loop"), "deny"),
}

#: The project config files opencode reads in its working directory; each one
#: without a ``$schema`` it rewrites with one (``_SCHEMA_STAMP``), whatever the role.
_PROJECT_CONFIGS = (
    "opencode.json",
    "opencode.jsonc",
    ".opencode/opencode.json",
    ".opencode/opencode.jsonc",
)
_SCHEMA_STAMP = '{\n  "$schema": "https://opencode.ai/config.json",'

#: What opencode's tool parts say when it refused a call: asked and auto-rejected,
#: not offered (a denied tool), or denied by a pattern rule.
_REFUSALS = ("rejected permission", "unavailable tool", "rule which prevents you")


def _float(value: Any) -> float:
    try:
        return float(value or 0.0)
    except (TypeError, ValueError):
        return 0.0  # a cost that is no number is no cost reported


def parse_events(stdout: str) -> dict[str, Any]:
    """What a ``run --format json`` printed: ``session_id``, the answer ``text``
    (the text parts of the last message that had any), ``input_tokens`` and
    ``output_tokens`` (cache and reasoning included), ``cost_usd`` (opencode's),
    ``steps`` (finished model turns), ``refused`` (tool names) and ``error``
    (the last ``error`` event's ``(name, status, message)`` or None)."""
    parsed: dict[str, Any] = {
        "session_id": None,
        "text": "",
        "input_tokens": 0,
        "output_tokens": 0,
        "cost_usd": 0.0,
        "steps": 0,
        "refused": [],
        "error": None,
    }
    texts: dict[str, list[str]] = {}
    for event in json_lines(stdout):
        parsed["session_id"] = parsed["session_id"] or event.get("sessionID")
        kind = event.get("type")
        part = json_object(event.get("part"))
        if kind == "text" and part.get("text"):
            texts.setdefault(str(part.get("messageID")), []).append(str(part["text"]))
        elif kind == "step_finish":
            tokens = json_object(part.get("tokens"))
            cache = json_object(tokens.get("cache"))
            parsed["input_tokens"] += (
                as_int(tokens.get("input")) + as_int(cache.get("read")) + as_int(cache.get("write"))
            )
            parsed["output_tokens"] += as_int(tokens.get("output")) + as_int(
                tokens.get("reasoning")
            )
            parsed["cost_usd"] += _float(part.get("cost"))
            parsed["steps"] += 1
        elif kind == "tool_use":
            refused = _refused_tool(part)
            if refused:
                parsed["refused"].append(refused)
        elif kind == "error":
            error = json_object(event.get("error"))
            data = json_object(error.get("data"))
            parsed["error"] = (
                str(error.get("name") or "error"),
                data.get("statusCode"),
                str(data.get("message") or error.get("message") or ""),
            )
    if texts:
        parsed["text"] = "".join(list(texts.values())[-1])
    return parsed


def _refused_tool(part: dict[str, Any]) -> str | None:
    """The tool a ``tool_use`` part shows opencode refused, or None."""
    state = json_object(part.get("state"))
    tool = str(part.get("tool") or "")
    said = ""
    if state.get("status") == "error":
        said = str(state.get("error") or "")
    elif tool == "invalid":  # a call of a tool the model was not offered
        given = json_object(state.get("input"))
        said, tool = str(given.get("error") or ""), str(given.get("tool") or tool)
    if any(words in said.lower() for words in _REFUSALS):
        return tool
    return None


def _project_configs(cwd: Path) -> dict[Path, str]:
    """The project config files in ``cwd`` and their text, before a call."""
    found = {}
    for name in _PROJECT_CONFIGS:
        path = cwd / name
        try:
            found[path] = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue  # not there (or not text): opencode leaves it alone too
    return found


def _undo_schema_stamps(before: dict[Path, str]) -> None:
    """Put back each config file opencode only stamped with its ``$schema``: that
    is opencode's doing, not the agent's, and no change of the role's. A file the
    agent changed otherwise is left as it is."""
    for path, text in before.items():
        stamped = re.sub(r"^\s*\{", lambda _: _SCHEMA_STAMP, text, count=1)
        try:
            if stamped != text and path.read_text(encoding="utf-8") == stamped:
                path.write_text(text, encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue  # gone or unreadable now: the agent's change, to be seen as such


class OpencodeRunner(CliRunner):
    name = "opencode"
    program = "opencode"

    def model_ref(self) -> str | None:
        """The ``--model`` opencode is given: ``phasegate/<model>`` with a base_url."""
        b = self.binding
        if b.base_url:
            return f"{PROVIDER}/{b.model}"
        return b.model

    def permission(self, request: AgentRequest) -> dict[str, str]:
        """The role's permission; a read-only role may call its binding's MCP servers'
        tools too (``<server>_<tool>`` in opencode), the cartridge's consent."""
        if not request.read_only:
            return dict(BUILD_PERMISSION)
        servers = {f"{name}_*": "allow" for name in self.binding.mcp_servers}
        return {**READ_ONLY_PERMISSION, **servers}

    def config(self, request: AgentRequest, key_file: Path | None) -> dict[str, Any]:
        """The inline config (``OPENCODE_CONFIG_CONTENT``) of one call."""
        b = self.binding
        permission = self.permission(request)
        config: dict[str, Any] = {
            "autoupdate": False,
            "share": "disabled",
            "snapshot": False,  # phasegate owns the worktree's history
            "permission": dict(permission),
            "agent": {
                AGENT: {
                    "mode": "primary",
                    "description": "phasegate's role agent",
                    "permission": dict(permission),
                }
            },
        }
        model = self.model_ref()
        if model:
            config["model"] = model
            config["small_model"] = model  # never another provider's model
        if b.base_url:
            model_id = b.model or ""
            entry: dict[str, Any] = {"name": model_id}
            if b.input_usd_per_mtok is not None or b.output_usd_per_mtok is not None:
                price_in = b.input_usd_per_mtok or 0.0
                entry["cost"] = {  # USD per million tokens, cached input as input
                    "input": price_in,
                    "output": b.output_usd_per_mtok or 0.0,
                    "cache_read": price_in,
                    "cache_write": price_in,
                }
            options: dict[str, Any] = {"baseURL": b.base_url}
            if key_file is not None:
                options["apiKey"] = "{file:" + str(key_file) + "}"
            config["provider"] = {
                PROVIDER: {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": PROVIDER,
                    "options": options,
                    "models": {model_id: entry},
                }
            }
            config["enabled_providers"] = [PROVIDER]
        if b.mcp_servers:
            config["mcp"] = opencode_servers(b.mcp_servers)
        return config

    def argv(self, request: AgentRequest, *, resume: bool = True) -> list[str]:
        args = [self.executable(), "run", "--format", "json", "--agent", AGENT]
        args += ["--title", f"phasegate {request.role}"]
        model = self.model_ref()
        if model:
            args += ["--model", model]
        if resume and request.session_id:
            args += ["--session", request.session_id]
        return [*args, *self.binding.extra_args]

    @contextmanager
    def prepare(self, request: AgentRequest) -> Iterator[dict[str, str]]:
        call_dir = Path(tempfile.mkdtemp(prefix="opencode-call-", dir=request.state_dir))
        configs = _project_configs(request.cwd)
        try:
            yield self._env(request, self.home(request), call_dir)
        finally:
            shutil.rmtree(call_dir, ignore_errors=True)  # the key file with it
            _undo_schema_stamps(configs)

    def launch(self, request: AgentRequest, env: dict[str, str], *, resume: bool) -> Launch:
        return Launch(self.argv(request, resume=resume))

    def session_gone(self, result: AgentResult) -> bool:
        return "Session not found" in (result.error or "")

    def _env(self, request: AgentRequest, home: Path, call_dir: Path) -> dict[str, str]:
        b = self.binding
        extra = {
            "HOME": str(home),
            "XDG_CONFIG_HOME": str(home / ".config"),
            "XDG_DATA_HOME": str(home / ".local" / "share"),
            "XDG_STATE_HOME": str(home / ".local" / "state"),
            "XDG_CACHE_HOME": str(home / ".cache"),
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "OPENCODE_DISABLE_SHARE": "1",
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
        }
        env = child_env(b, extra=extra)
        key_file = None
        if b.base_url and b.api_key_env and env.get(b.api_key_env):
            # Out of opencode's environment, which its commands inherit.
            key_file = call_dir / "model-key"
            write_secret(key_file, env.pop(b.api_key_env))
        env["OPENCODE_CONFIG_CONTENT"] = json.dumps(self.config(request, key_file))
        env["OPENCODE_PERMISSION"] = json.dumps(self.permission(request))  # over managed config too
        return env

    def stopped(
        self, failure: AgentResult, outcome: ProcessOutcome, request: AgentRequest, launch: Launch
    ) -> AgentResult:
        # Killed mid-run: the turns that finished were printed, with their usage.
        parsed = parse_events(outcome.stdout)
        return replace(failure, session_id=parsed["session_id"], **self._spend(parsed))

    def _spend(self, parsed: dict[str, Any]) -> dict[str, Any]:
        """Tokens and opencode's cost; priced by the binding when opencode reported none."""
        spend = self.priced(parsed["input_tokens"], parsed["output_tokens"])
        return {**spend, "cost_usd": parsed["cost_usd"]} if parsed["cost_usd"] else spend

    def finished(
        self, outcome: ProcessOutcome, request: AgentRequest, launch: Launch
    ) -> AgentResult:
        parsed = parse_events(outcome.stdout)
        text = parsed["text"]
        fields: dict[str, Any] = {
            "exit_code": outcome.returncode,
            "session_id": parsed["session_id"],
            "duration_s": outcome.duration_s,
            **self._spend(parsed),
        }
        model_error = None
        if parsed["error"] is not None:
            name, status, message = parsed["error"]
            where = f"model API error {status}" if status else f"opencode error ({name})"
            model_error = f"{where}: {message[:500]}"
        return outcome.ended(text, fields, model_error=model_error, refused=parsed["refused"])
