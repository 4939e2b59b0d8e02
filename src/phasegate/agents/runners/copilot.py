"""The ``copilot`` runner: GitHub Copilot CLI, non-interactive (``copilot --output-format json``).

Facts about the CLI (npm ``@github/copilot`` 1.0.102: a loader and a native
binary in ``@github/copilot-linux-x64``; checked offline against
``phasegate.testing.model_server``, see docs/agent-clis.md):

- The prompt comes on stdin when there is no ``-p`` (no argv length limit);
  ``--output-format json`` prints one JSON object a line: ``user.message``,
  ``assistant.message`` (``data.content``, ``data.toolRequests``),
  ``tool.execution_start`` (``toolCallId``, ``toolName``),
  ``tool.execution_complete`` (``success``, ``error.code``: ``"denied"`` for a
  call a permission rule refused), ``session.error`` (``statusCode``,
  ``message``: a model error, after its own 5 retries of a 5xx) and last
  ``result`` (``sessionId``, ``exitCode``). A failed run exits 1.
- Its usage is in no line it prints: each model call is a
  ``session.usage_record`` (``inputTokens``, the cache reads included,
  ``outputTokens``, the reasoning included, ``cost`` 0 for a provider of
  one's own) appended to the session's ``session-state/<id>/events.jsonl``
  under ``COPILOT_HOME``, as the call goes, so a killed call's finished turns
  are there too. ``--usage-output-file`` would give the session's totals,
  a resumed session's earlier calls included.
- Bring-your-own-key: ``COPILOT_PROVIDER_BASE_URL`` (with ``/v1`` for an
  OpenAI-compatible server), ``COPILOT_PROVIDER_API_KEY``, ``COPILOT_MODEL``;
  ``COPILOT_PROVIDER_TYPE`` (``openai``, ``azure``, ``anthropic``) and
  ``COPILOT_PROVIDER_WIRE_API`` (``completions``, ``responses``) may be set in a
  binding's ``env``. ``COPILOT_OFFLINE=true`` skips every GitHub call (login,
  telemetry, its GitHub MCP server, updates). Its shell tool's commands see
  none of the ``COPILOT_PROVIDER_*`` variables.
- ``--resume ID`` continues a session; an unknown one exits 1 with "No
  session, task, or name matched" on stderr. ``--session-id UUID`` names a new one.
- Permissions: ``--available-tools`` is what the model is offered (a call of
  another tool fails with "Tool 'x' does not exist."), ``--deny-tool`` rules
  (``write``, ``shell``) win over ``--allow-all-tools``.
  A project's hooks (``.github/hooks/*.json``) and MCP servers (``.mcp.json``)
  are loaded in a trusted folder only (``--trust-folder``,
  ``COPILOT_ALLOW_ALL=true``), and a hook's command runs whatever the tool
  rules: phasegate never trusts the folder.
- The binary unpacks its JavaScript package (about 235 MB) into
  ``COPILOT_PKG_CACHE_HOME`` (else ``XDG_CACHE_HOME/copilot``) at its first
  start and reads it from there afterwards, read-only.

How phasegate drives it:

- HOME and ``COPILOT_HOME`` are the workflow's own (``state_dir/copilot-home``):
  no person's login, settings or MCP servers; its sessions are kept there.
- The package is unpacked once per machine and version (``--binary-version``
  says which) into phasegate's cache (``$XDG_CACHE_HOME/phasegate/copilot``,
  by ``copilot --version`` outside the sandbox, under a lock) and every call
  reads it there; where that cannot be written, each workflow's home gets its
  own copy.
- With ``base_url``: offline, the binding's model through the provider; the
  key (``api_key_env``) is handed over as ``COPILOT_PROVIDER_API_KEY`` and
  named in ``--secret-env-vars`` (kept from its commands, redacted from its
  output). Without: the model through GitHub's Copilot service, signed in by
  a token the binding passes (``pass_env = ["COPILOT_GITHUB_TOKEN"]``).
- Read-only roles are offered ``view``, ``grep`` and ``glob`` only, and
  ``write`` and ``shell`` are denied; the build role may use every tool but
  ``task`` (a subagent). A refused tool call fails the call
  (``permission_denied``), as for claude-code and opencode.
- Cost: Copilot reports none for a provider of one's own; tokens are priced
  by the binding's ``input_usd_per_mtok``/``output_usd_per_mtok``.
- Error kinds: ``model_error``, ``permission_denied``, ``timeout``,
  ``exit_code``, ``runner_error``.
"""

from __future__ import annotations

import fcntl
import os
import re
import subprocess
import threading
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from phasegate.agents.base import AgentRequest, AgentResult, json_object
from phasegate.agents.cli_runner import CliRunner, Launch, as_int, json_lines
from phasegate.agents.env import child_env
from phasegate.agents.process import ProcessOutcome

__all__ = [
    "BUILD_EXCLUDED",
    "CopilotRunner",
    "READ_ONLY_TOOLS",
    "binary_version",
    "package_cache",
    "parse_events",
    "usage_since",
]

#: What a read-only role is offered: reading and searching, nothing else.
READ_ONLY_TOOLS = ("view", "grep", "glob")
#: Permission rules a read-only role also gets, should a tool that writes be offered.
READ_ONLY_DENIED = ("write", "shell")
#: Not offered to the build role: a subagent, whose permissions are its own.
BUILD_EXCLUDED = ("task",)

#: What Copilot says when ``--resume`` names a session its home does not hold.
_UNKNOWN_SESSION = "No session, task, or name matched"
#: What Copilot says when the model called a tool it was not offered (``view`` of a
#: missing file fails with "Path does not exist": no refusal).
_NOT_OFFERED = re.compile(r"^Tool '[^']*' does not exist")
#: The variable Copilot reads the provider's key from.
_KEY_VAR = "COPILOT_PROVIDER_API_KEY"
#: Seconds the one-time unpacking of Copilot's package may take.
_UNPACK_TIMEOUT_S = 300.0

_unpack_lock = threading.Lock()


def parse_events(stdout: str) -> dict[str, Any]:
    """What a ``--output-format json`` run printed: ``session_id`` (the ``result``
    line's), ``text`` (the last assistant message with any content),
    ``refused`` (the names of the tools whose calls a rule refused or that were
    not offered) and ``error`` (the last ``session.error``'s ``(status, message)``
    or None)."""
    parsed: dict[str, Any] = {"session_id": None, "text": "", "refused": [], "error": None}
    tools: dict[str, str] = {}
    for event in json_lines(stdout):
        kind = event.get("type")
        data = json_object(event.get("data"))
        if kind == "result":
            parsed["session_id"] = event.get("sessionId") or parsed["session_id"]
        elif kind == "assistant.message" and data.get("content"):
            parsed["text"] = str(data["content"])
        elif kind == "tool.execution_start":
            tools[str(data.get("toolCallId"))] = str(data.get("toolName") or "")
        elif kind == "tool.execution_complete" and not data.get("success"):
            error = json_object(data.get("error"))
            if error.get("code") == "denied" or _NOT_OFFERED.match(str(error.get("message") or "")):
                parsed["refused"].append(tools.get(str(data.get("toolCallId")), "unknown"))
        elif kind == "session.error":
            parsed["error"] = (data.get("statusCode"), str(data.get("message") or ""))
    return parsed


def usage_since(events_file: Path, offset: int) -> tuple[int, int]:
    """``(input_tokens, output_tokens)`` of the ``session.usage_record`` lines
    appended to a session's ``events.jsonl`` past byte ``offset``, the cache
    reads and the reasoning included; ``(0, 0)`` when there is no such file."""
    try:
        with events_file.open("rb") as f:
            f.seek(offset)
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return 0, 0
    tokens_in = tokens_out = 0
    for event in json_lines(text):
        if event.get("type") != "session.usage_record":
            continue
        data = json_object(event.get("data"))
        usage = json_object(data.get("usage"))
        # inputTokens holds the cache reads already (cacheReadTokens is their share),
        # outputTokens the reasoning: from OpenAI's and Anthropic's usage alike.
        tokens_in += as_int(usage.get("inputTokens"))
        tokens_out += as_int(usage.get("outputTokens"))
    return tokens_in, tokens_out


def binary_version(exe: str, environ: Mapping[str, str] | None = None) -> str | None:
    """What ``exe --binary-version`` says its version is ("1.0.102"), or None: a
    program that does not start or says something else."""
    source = os.environ if environ is None else environ
    try:
        said = subprocess.run(
            [exe, "--binary-version"],
            env={"PATH": source.get("PATH", "/usr/bin:/bin"), "HOME": str(Path.home())},
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"version:?\s*(\d+(?:\.\d+)+\S*)", said)
    return match.group(1) if match else None


def package_cache(exe: str, environ: dict[str, str] | None = None) -> Path | None:
    """The directory Copilot's package is unpacked in for every call
    (``COPILOT_PKG_CACHE_HOME``): ``$XDG_CACHE_HOME/phasegate/copilot``
    (``~/.cache/...``), where ``exe --version`` unpacks the package of its
    version the first time, under a lock (two workers at once unpack it once).
    None when it cannot be: each workflow's home then gets a copy of its own."""
    source = os.environ if environ is None else environ
    root = Path(source.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "phasegate" / "copilot"
    version = binary_version(exe, source)
    if version is None:
        return None  # it would not start: the call says why
    unpacked = list(root.glob(f"pkg/*/{version}/.extraction-complete"))
    if unpacked:
        return root
    try:
        root.mkdir(parents=True, exist_ok=True)
        with _unpack_lock, (root / ".lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not list(root.glob(f"pkg/*/{version}/.extraction-complete")):
                env = {
                    "PATH": source.get("PATH", "/usr/bin:/bin"),
                    "HOME": str(root),
                    "COPILOT_PKG_CACHE_HOME": str(root),
                    "COPILOT_OFFLINE": "true",
                    "COPILOT_AUTO_UPDATE": "false",
                }
                subprocess.run(
                    [exe, "--version", "--no-auto-update"],
                    env=env,
                    capture_output=True,
                    timeout=_UNPACK_TIMEOUT_S,
                    check=True,
                )
    except (OSError, subprocess.SubprocessError):
        return None  # unwritable here
    return root if list(root.glob(f"pkg/*/{version}/.extraction-complete")) else None


class CopilotRunner(CliRunner):
    name = "copilot"
    program = "copilot"

    def argv(self, request: AgentRequest, session_id: str, *, resume: bool) -> list[str]:
        """The command line of one call: ``--resume`` an existing session, or
        ``--session-id`` a new one (so its events file is known before it ends)."""
        b = self.binding
        args = [self.executable(), "--output-format", "json", "--no-auto-update"]
        args += ["--no-ask-user", "--disable-builtin-mcps", "--allow-all-tools"]
        args += ["--resume", session_id] if resume else ["--session-id", session_id]
        if b.model:
            args += ["--model", b.model]
        if b.base_url and b.api_key_env:
            args.append(f"--secret-env-vars={_KEY_VAR}")
        if request.read_only:
            args += ["--available-tools", *READ_ONLY_TOOLS]
            for rule in READ_ONLY_DENIED:
                args += ["--deny-tool", rule]
        else:
            args += ["--excluded-tools", *BUILD_EXCLUDED]
        return [*args, *b.extra_args]

    def env(self, home: Path, pkg_cache: Path | None) -> dict[str, str]:
        """The process's environment: its own home, and the provider when ``base_url``."""
        b = self.binding
        extra = {
            "HOME": str(home),
            "COPILOT_HOME": str(home / ".copilot"),
            "XDG_CONFIG_HOME": str(home / ".config"),
            "XDG_STATE_HOME": str(home / ".local" / "state"),
            "XDG_CACHE_HOME": str(home / ".cache"),
            "COPILOT_AUTO_UPDATE": "false",
        }
        if pkg_cache is not None:
            extra["COPILOT_PKG_CACHE_HOME"] = str(pkg_cache)
        if b.base_url:
            extra["COPILOT_OFFLINE"] = "true"
            extra["COPILOT_PROVIDER_BASE_URL"] = b.base_url
        env = child_env(b, extra=extra)
        if b.base_url and b.api_key_env and b.api_key_env in env:
            # Under Copilot's own name, which its commands do not inherit.
            env[_KEY_VAR] = env.pop(b.api_key_env)
        return env

    @contextmanager
    def prepare(self, request: AgentRequest) -> Iterator[dict[str, str]]:
        yield self.env(self.home(request), package_cache(self.executable()))

    def launch(self, request: AgentRequest, env: dict[str, str], *, resume: bool) -> Launch:
        """``--resume`` the request's session, else ``--session-id`` a new one (so its
        events file, where its usage is, is known before it ends)."""
        resume = resume and bool(request.session_id)
        session_id = request.session_id if resume and request.session_id else str(uuid.uuid4())
        events_file = Path(env["COPILOT_HOME"]) / "session-state" / session_id / "events.jsonl"
        try:
            offset = events_file.stat().st_size
        except OSError:
            offset = 0
        return Launch(
            self.argv(request, session_id, resume=resume),
            session_id=session_id,
            files={"events": events_file},
            spent=lambda: usage_since(events_file, offset),
        )

    def session_gone(self, result: AgentResult) -> bool:
        return _UNKNOWN_SESSION in (result.error or "")

    def stopped(
        self, failure: AgentResult, outcome: ProcessOutcome, request: AgentRequest, launch: Launch
    ) -> AgentResult:
        # Killed mid-run: the turns that finished are in its events file.
        assert launch.spent is not None
        known = launch.session_id if launch.files["events"].exists() else None
        return replace(failure, session_id=known, **self.priced(*launch.spent()))

    def finished(
        self, outcome: ProcessOutcome, request: AgentRequest, launch: Launch
    ) -> AgentResult:
        assert launch.spent is not None
        parsed = parse_events(outcome.stdout)
        text = parsed["text"]
        fields: dict[str, Any] = {
            "exit_code": outcome.returncode,
            "session_id": parsed["session_id"],
            "duration_s": outcome.duration_s,
            **self.priced(*launch.spent()),
        }
        model_error = None
        if parsed["error"] is not None:
            status, message = parsed["error"]
            where = f"model API error {status}" if status else "copilot error"
            model_error = f"{where}: {message[:500]}"
        return outcome.ended(text, fields, model_error=model_error, refused=parsed["refused"])
