"""The ``aider`` runner: aider (PyPI ``aider-chat``), non-interactive (``--message-file``).

Facts about the CLI (``aider-chat`` 0.86.2, checked offline against
``phasegate.testing.model_server``; docs/agent-clis.md has the rest):

- Its model calls go through litellm: with ``--openai-api-base URL`` and
  ``--model openai/NAME``, ``POST URL/chat/completions`` (plain JSON with
  ``--no-stream``, so the usage is the server's, not aider's own estimate).
  aider has no tools: the model answers in an *edit format* that aider
  parses and applies. For a model it does not know that is ``whole``: a line
  with the file's path, then the whole new content in a fence. Text with no
  such listing is only an answer.
- ``--message-file FILE`` sends the file's text as one message, applies the
  edits, reflects on what failed (an edit that did not match, up to three
  times: "Only 3 reflections allowed, stopping.") and exits **0, whatever
  happened**: a model error too. How a run went is read from its files:
  ``--analytics-log`` (JSON lines; with ``--no-analytics`` nothing leaves the
  machine but the log is still written: ``message_send_starting`` per model
  turn, ``message_send`` with exact ``prompt_tokens``, ``completion_tokens``
  and ``cost`` in USD when the turn succeeded) and ``--llm-history-file``
  (every request and response; each line of a response is written
  ``ASSISTANT <line>``, so the answer is read back unambiguously).
- A failed model call is retried by aider itself with exponential backoff
  from 0.25 s to 32 s (about a minute in all) for the errors it deems
  transient (HTTP 5xx, connection errors, rate limits); there is no flag to
  turn that off. The call's ``timeout`` must be longer, or an outage ends as
  ``timeout`` rather than ``model_error``.
- ``--yes-always`` answers yes to creating and editing files, and **no** to
  running shell commands (they need an explicit yes).
- Read-only roles run in aider's own read-only mode: ``--edit-format ask``
  (aider's ask mode: the reply is never parsed for edits) and ``--dry-run``
  (no edit is written even if one is parsed: "Did not apply edit to X
  (--dry-run)"). AgentService still checks the checkout after the call and
  undoes any change as ``read_only_violation``: ``extra_args`` come last and
  can switch both off.
- ``--no-git``: with git, aider ``git add`` s the files it creates, in the
  repository's git dir, which phasegate's sandbox keeps read-only (the edit
  then fails), and it would commit (``--auto-commits``) where phasegate makes
  the commits. Without git aider sees no file list and no repo map: the
  model knows the checkout only from the prompt (and the files
  ``extra_args`` add with ``--file``/``--read``). Its repo map is off
  (``--map-tokens 0``): it would need git and writes a tag cache into the
  checkout.
- Cost is aider's, from litellm's prices or, when the binding gives
  ``input_usd_per_mtok``/``output_usd_per_mtok``, from those (passed as
  ``--model-metadata-file``). For a model it has no metadata of, aider
  fetches litellm's price list from GitHub on every start (a failed fetch is
  not cached); a model behind ``base_url`` gets a metadata entry without
  prices, so it does not (cost 0 unless the binding prices it). aider has no
  spend cap: a call that spent more than its budget fails as ``budget`` after
  the fact.
- A write the sandbox refused is worded by aider ("Unable to create ../x,
  skipping edits."), with no EROFS for ``sandbox.refused_writes`` to find;
  such a line naming a path outside the checkout, or in its ``.git``, is a
  ``sandbox_denied`` violation. The edits inside the checkout still apply.
- Sessions: one chat history file per session line
  (``--chat-history-file``, Markdown, restored with
  ``--restore-chat-history``): the session id is the file's name. The
  restore is aider's own parse of the Markdown: a prompt line gets two
  trailing spaces, and a reply line that starts with ``> `` or ``#### `` is
  read as aider's output or a prompt. The ``fresh`` line starts a new chat
  every call.
- HOME is a directory of the workflow's own (aider writes ``~/.aider`` there);
  the environment holds only what the binding names, and the key also as
  ``<PROVIDER>_API_KEY`` (``OPENAI_API_KEY`` for ``openai/...``), never on
  the command line (aider writes its command line into the chat history).
- Error kinds: ``model_error`` (a model call failed after aider's retries,
  or its edits did not apply after its reflections), ``budget``, ``timeout``,
  ``exit_code``, ``runner_error``.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from phasegate.agents.base import AgentRequest, AgentResult, Violation
from phasegate.agents.cli_runner import (
    CliRunner,
    Launch,
    alias_key,
    provider_key_env,
    read_text,
)
from phasegate.agents.env import child_env
from phasegate.agents.process import ProcessOutcome

__all__ = ["AiderRunner", "answers", "parse_run", "usage"]

#: Flags every call gets: nothing asks, nothing leaves the machine but the model
#: call, nothing is written in the checkout but the edits.
BASE_FLAGS = (
    "--yes-always",
    "--no-git",
    "--no-auto-commits",
    "--no-dirty-commits",
    "--no-gitignore",
    "--map-tokens",
    "0",
    "--no-check-update",
    "--no-show-release-notes",
    "--no-analytics",
    "--no-show-model-warnings",
    "--no-detect-urls",
    "--disable-playwright",
    "--no-suggest-shell-commands",
    "--no-auto-lint",
    "--no-auto-test",
    "--no-pretty",
    "--no-fancy-input",
    "--no-stream",
)
READ_ONLY_FLAGS = ("--edit-format", "ask", "--dry-run")
_SESSION_ID = re.compile(r"aider-[0-9a-f]{32}")
_RESPONSE = re.compile(r"LLM RESPONSE \d{4}-\d\d-\d\dT\S+")
_STOPPED_REFLECTING = re.compile(r"Only \d+ reflections allowed, stopping\.")
_ERROR_LINE = re.compile(r"^(litellm\.\S+|.*Error: .*)$", re.MULTILINE)
#: How aider says a write failed (the sandbox's EROFS among the causes).
_UNABLE = re.compile(r"^Unable to (?:create|write) (.+?)(?:, skipping edits\.|:.*)?$", re.MULTILINE)


def answers(llm_history: str) -> list[str]:
    """The text of each model response in an ``--llm-history-file`` (empty for a
    call that failed), in order. Every line of a response is ``ASSISTANT <line>``;
    the next line that is not ends it."""
    texts: list[str] = []
    current: list[str] | None = None
    for line in llm_history.splitlines():
        if current is not None and (line == "ASSISTANT" or line.startswith("ASSISTANT ")):
            current.append(line[len("ASSISTANT ") :])
            continue
        if current is not None:
            texts.append("\n".join(current))
            current = None
        if _RESPONSE.fullmatch(line):
            current = []
    if current is not None:
        texts.append("\n".join(current))
    return texts


def usage(analytics_log: str) -> dict[str, Any]:
    """Model turns started and finished, tokens and cost (USD) in an ``--analytics-log``,
    and the text of an exception a turn ended with."""
    totals: dict[str, Any] = {
        "started": 0,
        "finished": 0,
        "input_tokens": 0,
        "output_tokens": 0,
        "cost_usd": 0.0,
        "exception": None,
    }
    for line in analytics_log.splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by a killed process
        if not isinstance(event, dict):
            continue
        name, props = event.get("event"), event.get("properties") or {}
        if name == "message_send_starting":
            totals["started"] += 1
        elif name == "message_send":
            totals["finished"] += 1
            totals["input_tokens"] += int(props.get("prompt_tokens") or 0)
            totals["output_tokens"] += int(props.get("completion_tokens") or 0)
            totals["cost_usd"] += float(props.get("cost") or 0.0)
        elif name == "message_send_exception":
            totals["exception"] = str(props.get("exception") or "")
    return totals


def parse_run(
    outcome: ProcessOutcome,
    analytics_log: str,
    llm_history: str,
    *,
    budget_usd: float | None = None,
    session_id: str | None = None,
) -> AgentResult:
    """The AgentResult of a finished aider process, from its analytics log and LLM
    history (aider exits 0 whatever happened to the model call)."""
    spent = usage(analytics_log)
    replies = [t for t in answers(llm_history) if t.strip()]
    text = replies[-1].strip() if replies else ""
    fields: dict[str, Any] = {
        "exit_code": outcome.returncode,
        "session_id": session_id,
        "input_tokens": spent["input_tokens"],
        "output_tokens": spent["output_tokens"],
        "cost_usd": spent["cost_usd"],
        "duration_s": outcome.duration_s,
    }
    if outcome.returncode:
        return AgentResult(
            text,
            error_kind="exit_code",
            error=f"aider exited with code {outcome.returncode}: {outcome.tail()}",
            **fields,
        )
    if spent["exception"] or spent["started"] > spent["finished"]:
        found = _ERROR_LINE.findall(outcome.stdout)
        detail = spent["exception"] or (found[-1] if found else outcome.tail(500))
        return AgentResult(
            text, error_kind="model_error", error=f"model API error: {detail[:500]}", **fields
        )
    if spent["started"] == 0:
        return AgentResult(
            text,
            error_kind="exit_code",
            error=f"aider asked no model (exit code 0): {outcome.tail()}",
            **fields,
        )
    if _STOPPED_REFLECTING.search(outcome.stdout):
        return AgentResult(
            text,
            error_kind="model_error",
            error="the model's edits did not apply: "
            + _STOPPED_REFLECTING.findall(outcome.stdout)[-1],
            **fields,
        )
    if budget_usd is not None and spent["cost_usd"] > budget_usd:
        return AgentResult(
            text,
            error_kind="budget",
            error=f"spent ${spent['cost_usd']:.4f}, over the call's budget of ${budget_usd:.4f}"
            " (aider has no spend cap of its own)",
            **fields,
        )
    return AgentResult(text, **fields)


class AiderRunner(CliRunner):
    name = "aider"
    program = "aider"
    home_dir = "aider"
    needs_model = True

    def argv(self, request: AgentRequest, files: dict[str, Path], *, restore: bool) -> list[str]:
        """The command line; ``files`` names the message, analytics log, LLM history,
        chat history, input history, env file and (optional) model metadata file."""
        b = self.binding
        args = [self.executable(), "--message-file", str(files["message"]), *BASE_FLAGS]
        args += ["--model", b.model or ""]
        if b.base_url:
            args += ["--openai-api-base", b.base_url]
        args += [
            "--analytics-log",
            str(files["analytics"]),
            "--llm-history-file",
            str(files["llm_history"]),
            "--chat-history-file",
            str(files["chat_history"]),
            "--input-history-file",
            str(files["input_history"]),
            "--env-file",
            str(files["env_file"]),
            "--restore-chat-history" if restore else "--no-restore-chat-history",
        ]
        if "metadata" in files:
            args += ["--model-metadata-file", str(files["metadata"])]
        if request.read_only:
            args += READ_ONLY_FLAGS
        return [*args, *b.extra_args]

    def environment(self, home: Path) -> dict[str, str]:
        b = self.binding
        extra = {
            "HOME": str(home),
            # litellm fetches its price table on import unless told not to.
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            # aider offers to open a documentation URL after some errors, and
            # --yes-always accepts: let "opening" it do nothing.
            "BROWSER": "true",
        }
        alias = provider_key_env(b.model or "", "OPENAI_API_KEY")
        return alias_key(b, child_env(b, extra=extra), alias)

    def _write_metadata(self, home: Path) -> Path | None:
        """The binding's prices as aider's model metadata. Without prices, an entry
        all the same for a model behind ``base_url`` (litellm does not know it):
        aider would fetch litellm's price list from GitHub on every call to look
        for it. A model litellm prices, reached directly, keeps litellm's prices."""
        b = self.binding
        priced = b.input_usd_per_mtok is not None or b.output_usd_per_mtok is not None
        if not priced and not b.base_url:
            return None
        model = b.model or ""
        entry: dict[str, Any] = {
            "litellm_provider": model.split("/", 1)[0] if "/" in model else "openai",
            "mode": "chat",
        }
        if priced:
            entry["input_cost_per_token"] = (b.input_usd_per_mtok or 0.0) / 1_000_000
            entry["output_cost_per_token"] = (b.output_usd_per_mtok or 0.0) / 1_000_000
        path = home / "model-metadata.json"
        path.write_text(json.dumps({model: entry}), encoding="utf-8")
        return path

    def session(self, request: AgentRequest, sessions: Path) -> tuple[str | None, Path, bool]:
        """The session id, its chat history file, and whether to restore it: the
        line's session when its file is there, else a new one (none for ``fresh``)."""
        if request.session_line == "fresh":
            fresh = sessions / f"fresh-{request.role}.md"
            fresh.unlink(missing_ok=True)
            return None, fresh, False
        known = request.session_id
        if known and _SESSION_ID.fullmatch(known) and (sessions / f"{known}.md").is_file():
            return known, sessions / f"{known}.md", True
        new = f"aider-{uuid.uuid4().hex}"
        return new, sessions / f"{new}.md", False

    @contextmanager
    def prepare(self, request: AgentRequest) -> Iterator[dict[str, str]]:
        home = self.home(request)
        (home / "sessions").mkdir(parents=True, exist_ok=True)
        yield self.environment(home)

    def launch(self, request: AgentRequest, env: dict[str, str], *, resume: bool) -> Launch:
        home = self.home(request)
        session_id, chat_history, restore = self.session(request, home / "sessions")
        files = {
            "message": home / f"{request.role}.message.md",
            "analytics": home / f"{request.role}.analytics.jsonl",
            "llm_history": home / f"{request.role}.llm-history.txt",
            "chat_history": chat_history,
            "input_history": home / "input-history.txt",
            "env_file": home / ".env",  # never written: no .env of phasegate's
        }
        metadata = self._write_metadata(home)
        if metadata is not None:
            files["metadata"] = metadata
        files["message"].write_text(request.prompt, encoding="utf-8")
        for name in ("analytics", "llm_history"):
            files[name].unlink(missing_ok=True)  # never read a previous call's
        argv = self.argv(request, files, restore=restore)
        return Launch(argv, stdin="", session_id=session_id, files=files)

    def inspect(self, outcome: ProcessOutcome, request: AgentRequest) -> ProcessOutcome:
        return _refusals(outcome, request)

    def stopped(
        self, failure: AgentResult, outcome: ProcessOutcome, request: AgentRequest, launch: Launch
    ) -> AgentResult:
        spent = usage(read_text(launch.files["analytics"]))
        return replace(
            failure,
            session_id=launch.session_id,
            input_tokens=spent["input_tokens"],
            output_tokens=spent["output_tokens"],
            cost_usd=spent["cost_usd"],
        )

    def finished(
        self, outcome: ProcessOutcome, request: AgentRequest, launch: Launch
    ) -> AgentResult:
        return parse_run(
            outcome,
            read_text(launch.files["analytics"]),
            read_text(launch.files["llm_history"]),
            budget_usd=request.budget_usd,
            session_id=launch.session_id,
        )


def _refusals(outcome: ProcessOutcome, request: AgentRequest) -> ProcessOutcome:
    """``outcome`` with a ``sandbox_denied`` violation for each file aider could not
    create or write outside the checkout, under a sandbox: aider says so in its own
    words ("Unable to create ../x, skipping edits."), without the EROFS."""
    confinement = request.confinement
    if confinement is None or not confinement.confined:
        return outcome
    cwd = request.cwd.resolve()
    found = []
    for match in _UNABLE.finditer(outcome.stdout):
        path = (cwd / match.group(1).strip()).resolve()
        if not path.is_relative_to(cwd) or path.is_relative_to(cwd / ".git"):
            detail = f"the sandbox refused aider a write to {path}: {match.group(0)}"
            found.append(Violation("sandbox_denied", detail, (str(path),)))
    if not found:
        return outcome
    return replace(outcome, violations=(*outcome.violations, *found))
