"""The ``codex`` runner: the Codex CLI, non-interactive (``codex exec --json``).

- The prompt goes on stdin (``-``); the JSON-lines events give the thread id,
  the agent's messages (the last one is the answer) and the usage.
- One thread per session line, resumed across rounds with
  ``codex exec resume THREAD_ID``.
- ``CODEX_HOME`` is a directory of the workflow's own, holding the config
  phasegate writes (model, provider, approval policy ``never``); the sandbox is
  ``read-only`` for read-only roles and ``workspace-write`` for the build role.
- Codex reports a thread's usage as running totals; the runner keeps the last
  totals per thread in its CODEX_HOME and records the difference, so a resumed
  thread is never counted twice. Codex reports no cost: it is priced from the
  binding's ``input_usd_per_mtok``/``output_usd_per_mtok`` when given.
- A call that fails or times out after answered turns gets no ``turn.completed``
  on stdout, but it spent: its totals are then read from Codex's own session
  log, ``CODEX_HOME/sessions/YYYY/MM/DD/rollout-<time>-<thread>.jsonl`` (one
  JSON object a line; the last ``{"type": "event_msg", "payload": {"type":
  "token_count", "info": {"total_token_usage": {...}}}}`` holds the thread's
  running totals, the same numbers ``turn.completed`` gives), so a spend cap
  sees what a failed call cost.
- Codex's own sandbox (``bwrap`` on PATH, ``workspace-write``) runs each command
  through a ``codex-linux-sandbox`` alias Codex links under ``CODEX_HOME/tmp``,
  and it refuses to make that alias when CODEX_HOME lies under the temp dir
  (``TMPDIR``, else /tmp): every command then fails ("bwrap: execvp
  codex-linux-sandbox"). CODEX_HOME is under the repository's ``.phasegate/``,
  which is under /tmp in a dry run's clone, so each call gets a private
  ``TMPDIR`` of its own beside CODEX_HOME (``state_dir/codex-tmp-*``, removed
  after the call); phasegate's sandbox replaces it with its per-run one.
- Inside phasegate's sandbox Codex keeps its own where that works: its bwrap
  makes a user namespace of its own, which fails when phasegate runs as root
  (a container, CI: with every capability dropped, root may not map uid 0,
  "bwrap: setting up uid map: Operation not permitted"). There
  (``own_sandbox_fails``, probed once) Codex runs ``danger-full-access`` and
  phasegate's sandbox alone confines its commands: the worktree, the state dir
  and a private temp dir writable, the network as the cartridge says
  (Codex's own would have cut it), a read-only role held to its checkout by
  the ``read_only_violation`` check.
- Error kinds: ``model_error`` (a failed turn), ``timeout``, ``exit_code``,
  ``runner_error``.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from phasegate.agents.base import AgentRequest, AgentResult
from phasegate.agents.cli_runner import CliRunner, Launch, json_lines
from phasegate.agents.env import child_env
from phasegate.agents.mcp import codex_toml
from phasegate.agents.process import ProcessOutcome
from phasegate.proc.sandbox import Bubblewrap, Confinement

__all__ = ["CodexRunner", "own_sandbox_fails", "parse_events", "rollout_totals"]


def _toml_str(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


def parse_events(stdout: str) -> dict[str, Any]:
    """Thread id, answer text, running usage totals and the failure of a JSON-lines run."""
    parsed: dict[str, Any] = {"thread_id": None, "text": "", "usage": None, "failure": None}
    for event in json_lines(stdout):
        kind = event.get("type")
        item = event.get("item") or {}
        if kind == "thread.started":
            parsed["thread_id"] = event.get("thread_id")
        elif kind == "item.completed" and item.get("type") == "agent_message":
            parsed["text"] = item.get("text", "")
        elif kind == "turn.completed":
            parsed["usage"] = event.get("usage") or {}
        elif kind == "turn.failed":
            parsed["failure"] = (event.get("error") or {}).get("message") or "turn failed"
        elif kind == "error" and not parsed["failure"]:
            parsed["failure"] = event.get("message") or "error"
    return parsed


_THREAD_ID = re.compile(r"[0-9A-Za-z-]+")


def rollout_totals(home: Path, thread: str | None) -> dict[str, Any] | None:
    """The thread's latest running usage totals in Codex's session log under ``home``
    (the last ``token_count`` event's ``total_token_usage``), or None when it has none."""
    if not thread or not _THREAD_ID.fullmatch(thread):
        return None
    logs = sorted(
        (home / "sessions").glob(f"**/rollout-*-{thread}.jsonl"), key=lambda p: p.stat().st_mtime
    )
    totals: dict[str, Any] | None = None
    for log in logs:
        try:
            lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            if '"token_count"' not in line:
                continue
            try:
                payload = json.loads(line).get("payload") or {}
            except (json.JSONDecodeError, AttributeError):
                continue  # e.g. a line cut short by a killed process
            if not isinstance(payload, dict) or payload.get("type") != "token_count":
                continue
            usage = (payload.get("info") or {}).get("total_token_usage")
            if isinstance(usage, dict) and usage:
                totals = usage
    return totals


#: What Codex's bwrap asks for its commands: user, PID and network namespaces of their own.
_OWN_SANDBOX_PROBE = (
    "--unshare-user",
    "--unshare-pid",
    "--unshare-net",
    "--ro-bind",
    "/",
    "/",
    "--cap-drop",
    "ALL",
    "--",
    "true",
)


@functools.cache
def own_sandbox_fails(network: bool = True) -> str | None:
    """None when Codex's own sandbox starts inside phasegate's bubblewrap sandbox
    (with ``network`` as given), else why not (bwrap's last line).

    Runs, confined as an agent is, the bwrap found on PATH (the one Codex
    prefers to its bundled copy) making the namespaces Codex's makes; the
    answer is cached per process.
    """
    outer = Bubblewrap()
    inner = shutil.which("bwrap") or outer.executable
    with tempfile.TemporaryDirectory(prefix="phasegate-codex-probe-") as tmp:
        argv = outer.wrap(
            [inner, *_OWN_SANDBOX_PROBE],
            Confinement("bwrap", network=network),
            Path("/"),
            Path(tmp),
        )
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{inner} cannot run inside phasegate's sandbox: {exc}"
    if done.returncode == 0:
        return None
    why = (done.stderr.strip() or done.stdout.strip()).splitlines()
    return why[-1] if why else f"exit code {done.returncode}"


class CodexRunner(CliRunner):
    name = "codex"
    program = "codex"
    home_dir = "codex-home"

    def _write_config(self, home: Path) -> None:
        b = self.binding
        lines = [
            'approval_policy = "never"',
            # The commands the model runs see no key: Codex itself holds the model key,
            # its shell does not (a build must not be able to write it into the change).
            'shell_environment_policy.inherit = "core"',
            'shell_environment_policy.exclude = ["*KEY*", "*TOKEN*", "*SECRET*", "*PASSWORD*"]',
            # Codex's own sandbox (bwrap, when on PATH) protects a `.git` in each of its
            # writable roots and fails on /tmp ("Can't mkdir /tmp/.git"): its commands
            # get the worktree and TMPDIR (a private one per call: see run()).
            "sandbox_workspace_write.exclude_slash_tmp = true",
        ]
        if b.model:
            lines.append(f"model = {_toml_str(b.model)}")
        if b.base_url:
            lines += [
                'model_provider = "phasegate"',
                "",
                "[model_providers.phasegate]",
                'name = "phasegate"',
                f"base_url = {_toml_str(b.base_url)}",
                'wire_api = "responses"',
                f"env_key = {_toml_str(b.api_key_env or 'OPENAI_API_KEY')}",
            ]
        lines += codex_toml(b.mcp_servers)
        (home / "config.toml").write_text("\n".join(lines) + "\n", encoding="utf-8")
        (home / "config.toml").chmod(0o600)  # an MCP server's env may hold a key

    def argv(self, request: AgentRequest, *, resume: bool = True) -> list[str]:
        """The ``codex exec`` command line for ``request``: Codex's own sandbox
        ``read-only`` or ``workspace-write``, or ``danger-full-access`` inside
        phasegate's sandbox where Codex's cannot start (``own_sandbox_fails``)."""
        sandbox = "read-only" if request.read_only else "workspace-write"
        c = request.confinement
        if c is not None and c.confined and own_sandbox_fails(c.network) is not None:
            sandbox = "danger-full-access"  # phasegate's bwrap confines every command
        args = [
            self.executable(),
            "exec",
            "--skip-git-repo-check",
            "--json",
            "-c",
            "analytics.enabled=false",
            "-s",
            sandbox,
            *self.binding.extra_args,
        ]
        if resume and request.session_id:
            args += ["resume", request.session_id]
        return [*args, "-"]

    @contextmanager
    def prepare(self, request: AgentRequest) -> Iterator[dict[str, str]]:
        assert request.state_dir is not None  # run() refuses a request without one
        home = self.home(request)
        self._write_config(home)
        # Not the temp dir CODEX_HOME may lie under (a dry run's clone is in /tmp):
        # there Codex makes no codex-linux-sandbox alias and its bwrap runs nothing.
        tmp = tempfile.mkdtemp(prefix="codex-tmp-", dir=request.state_dir)
        extra = {"HOME": str(home), "CODEX_HOME": str(home), "TMPDIR": tmp}
        try:
            yield child_env(self.binding, extra=extra)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)  # Codex's mount targets, its commands' files

    def launch(self, request: AgentRequest, env: dict[str, str], *, resume: bool) -> Launch:
        return Launch(self.argv(request, resume=resume))

    def session_gone(self, result: AgentResult) -> bool:
        return result.error_kind == "exit_code" and "not found" in (result.error or "")

    def stopped(
        self, failure: AgentResult, outcome: ProcessOutcome, request: AgentRequest, launch: Launch
    ) -> AgentResult:
        if failure.error_kind != "timeout":
            return failure
        # killed mid-turn: what the answered turns cost is in the session log
        thread = parse_events(outcome.stdout)["thread_id"]
        return replace(failure, **self._spend(self.home(request), thread, None))

    def _spend(
        self, home: Path, thread: str | None, usage: dict[str, Any] | None
    ) -> dict[str, Any]:
        """This call's tokens and cost: ``usage`` (``turn.completed``'s running totals)
        or, when the call ended without it, the session log's, less what earlier calls
        on the thread were charged."""
        return self.priced(*self._usage_delta(home, thread, usage or rollout_totals(home, thread)))

    def finished(
        self, outcome: ProcessOutcome, request: AgentRequest, launch: Launch
    ) -> AgentResult:
        parsed = parse_events(outcome.stdout)
        thread = parsed["thread_id"]
        fields: dict[str, Any] = {
            "exit_code": outcome.returncode,
            "session_id": thread,
            **self._spend(self.home(request), thread, parsed["usage"]),
            "duration_s": outcome.duration_s,
        }
        model_error = None
        if parsed["failure"] and (outcome.returncode or parsed["usage"] is None):
            model_error = f"codex turn failed: {parsed['failure']}"
        return outcome.ended(parsed["text"], fields, model_error=model_error)

    @staticmethod
    def _usage_delta(
        home: Path, thread: str | None, usage: dict[str, Any] | None
    ) -> tuple[int, int]:
        if not usage:
            return 0, 0
        totals = (int(usage.get("input_tokens", 0)), int(usage.get("output_tokens", 0)))
        if not thread:
            return totals
        ledger_path = home / "phasegate-usage.json"
        ledger = json.loads(ledger_path.read_text()) if ledger_path.exists() else {}
        before = ledger.get(thread, [0, 0])
        ledger[thread] = list(totals)
        ledger_path.write_text(json.dumps(ledger))
        if totals[0] < before[0] or totals[1] < before[1]:
            return totals  # not running totals after all
        return totals[0] - before[0], totals[1] - before[1]
