"""The ``api`` runner: one model call through litellm, any provider.

- ``model`` is a litellm model name (``anthropic/claude-…``, ``openai/gpt-…``,
  ``openai/<anything>`` with ``base_url`` for an OpenAI-compatible server);
  ``base_url`` becomes litellm's ``api_base``; the key is the value of the
  variable ``api_key_env`` names (the binding's ``env`` first, then
  phasegate's environment). Without ``api_key_env`` litellm looks up the
  provider's own variable (``OPENAI_API_KEY``, …) as it always does.
- The model sees no files and runs nothing. Read-only roles answer with text
  from what the prompt holds (the phases put the ticket, plan and diff there).
  The build role gets, besides the prompt, the list of tracked files and the
  content of the files the prompt names (bounded), and answers with one
  unified diff that the runner applies in the worktree
  (``Workspace.apply_patch``); a diff that does not apply, or reaches
  outside the worktree, is ``invalid_patch`` and changes nothing.
- Usage is the response's; cost is priced from the binding's
  ``input_usd_per_mtok``/``output_usd_per_mtok`` when given, else by
  litellm's price table when it knows the model, else 0.
- The call runs in a worker thread, so a shutdown (``cancel``) returns
  ``interrupted`` at once and the timeout is enforced even if the provider
  trickles; the abandoned thread ends at litellm's own timeout, and a process
  that exits waits for it up to 10 s.
- Error kinds: ``model_error`` (with the HTTP status; "no connection" and the
  socket's error when no server answered), ``timeout``,
  ``interrupted``, ``budget`` (the call cost more than it may; the text is
  kept, a diff is not applied), ``invalid_patch``, ``runner_error`` (litellm
  not installed, the key's variable unset).
"""

from __future__ import annotations

import atexit
import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from phasegate.agents.base import AgentRequest, AgentResult
from phasegate.agents.env import child_env
from phasegate.config.cartridge import RoleBinding
from phasegate.git.workspace import GitError, PatchError, Workspace, git

__all__ = ["ApiRunner", "build_context", "extract_diff"]

_POLL_S = 0.05
_EXIT_WAIT_S = 10.0  # seconds an exiting process gives calls abandoned at a timeout
_LISTING_CHARS = 20_000  # of `git ls-files` shown to the build role
_FILE_CHARS = 60_000  # of one file's content
_CONTEXT_CHARS = 200_000  # of all file contents together

READ_ONLY_SYSTEM = (
    "You are called through an API: you cannot read, run or change anything. "
    "Work only from what the user's message holds, and answer in plain text."
)
BUILD_SYSTEM = """\
You are the build step of a coding workflow, called through an API: you cannot \
run commands or edit files yourself. The orchestrator applies your change.

Answer with exactly one unified diff in a ```diff fenced block:
- paths relative to the repository root, with a/ and b/ prefixes \
(--- a/src/app.py, +++ b/src/app.py);
- a new file is --- /dev/null and +++ b/<path>; a deleted file is \
--- a/<path> and +++ /dev/null;
- hunks with @@ headers and three lines of unchanged context, copied exactly \
from the files shown.
One or two sentences before the block may say what the change does. Nothing \
outside the block is applied."""

_HOW_TO_ANSWER = """
## How to answer

You cannot edit files here. Answer with one unified diff in a ```diff block,
as the system message says; it is applied to the repository for you.
"""


def _load_litellm() -> ModuleType | None:
    # Offline by default: otherwise litellm fetches its price table from the
    # network on import (and logs a warning when it cannot).
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    try:
        import litellm
    except ImportError:
        return None
    litellm.suppress_debug_info = True  # it would print help banners on stdout
    return litellm


# -- the build role's context and answer ------------------------------------------


def _tracked_files(cwd: Path) -> list[str]:
    try:
        out = git(["ls-files", "-z"], cwd)
    except (GitError, OSError):
        return []
    return [name for name in out.split("\0") if name]


def _fenced(text: str) -> str:
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    newline = "" if text.endswith("\n") else "\n"
    return f"{fence}\n{text}{newline}{fence}"


def _mentioned(prompt: str, files: list[str]) -> list[str]:
    """Tracked files the prompt names: by path, or by a file name no other file has."""
    tokens = {t.rstrip(".,:;)") for t in re.findall(r"[\w.][\w./-]*", prompt)}
    tokens |= {t.removeprefix("./") for t in tokens}
    by_name: dict[str, list[str]] = {}
    for path in files:
        by_name.setdefault(path.rsplit("/", 1)[-1], []).append(path)
    found = []
    for path in files:
        name = path.rsplit("/", 1)[-1]
        if path in tokens or (name in tokens and len(by_name[name]) == 1 and "." in name):
            found.append(path)
    return found


def build_context(prompt: str, cwd: Path) -> str:
    """What the build role is shown besides its prompt: the tracked files of
    ``cwd`` and the content of those the prompt names, at most about 220 kB."""
    files = _tracked_files(cwd)
    if not files:
        return ""
    listing = "\n".join(files)
    if len(listing) > _LISTING_CHARS:
        kept = listing[:_LISTING_CHARS].split("\n")[:-1]  # the last one may be cut
        listing = "\n".join([*kept, f"… ({len(files) - len(kept)} more)"])
    parts = [f"\n## Repository files (`git ls-files`, {len(files)})\n\n{_fenced(listing)}\n"]
    budget = _CONTEXT_CHARS
    shown: list[str] = []
    for path in _mentioned(prompt, files):
        file = cwd / path
        if file.is_symlink():
            continue  # it may point out of the worktree: nothing outside is sent
        try:
            data = file.read_bytes()
        except OSError:
            continue  # deleted in the worktree, or a directory (a submodule)
        if b"\0" in data[:8192] or budget <= 0:
            continue
        text = data.decode("utf-8", errors="replace")
        limit = min(_FILE_CHARS, budget)
        if len(text) > limit:
            text = text[:limit] + "\n[… the rest of the file is left out]\n"
        budget -= len(text)
        shown.append(f"### {path}\n\n{_fenced(text)}\n")
    if shown:
        parts.append("\n## Files the prompt names\n\n" + "\n".join(shown))
    return "".join(parts)


_FENCE_OPEN = re.compile(r"^```+\s*([\w+-]*)\s*$")
_DIFF_LANGS = frozenset({"diff", "patch", "udiff"})


def _looks_like_diff(text: str) -> bool:
    return bool(re.search(r"^(diff --git |--- \S)", text, re.M)) and "\n+++ " in f"\n{text}"


def extract_diff(answer: str) -> str | None:
    """The unified diff in a model's answer: its ```diff blocks joined, else a
    fenced block that holds a diff, else the answer itself when it is one."""
    blocks: list[tuple[str, str]] = []
    lines: list[str] | None = None
    lang = ""
    for line in answer.splitlines(keepends=True):
        bare = line.rstrip("\r\n")
        if lines is None:
            match = _FENCE_OPEN.match(bare)
            if match:
                lines, lang = [], match.group(1).lower()
        # A diff's own lines start with a space, +, - or @: a bare fence closes the block.
        elif re.fullmatch(r"```+\s*", bare):
            blocks.append((lang, "".join(lines)))
            lines = None
        else:
            lines.append(line)
    if lines is not None:  # unterminated: the answer was cut off
        blocks.append((lang, "".join(lines)))
    labelled = [body for lang, body in blocks if lang in _DIFF_LANGS and body.strip()]
    if labelled:
        return "".join(b if b.endswith("\n") else b + "\n" for b in labelled)
    other = next((body for _, body in blocks if _looks_like_diff(body)), None)
    if other is not None:
        return other
    return answer if _looks_like_diff(answer) else None


# -- the runner ----------------------------------------------------------------------


class _Call:
    """One litellm call on a daemon thread: its response or its exception."""

    running: set[_Call] = set()  # those still running, abandoned ones included

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.response: Any = None
        self.error: Exception | None = None
        self.done = threading.Event()
        self._fn = fn
        _Call.running.add(self)
        threading.Thread(target=self._run, name="phasegate-api-call", daemon=True).start()

    def _run(self) -> None:
        try:
            self.response = self._fn()
        except Exception as exc:  # handed to the caller, who names it
            self.error = exc
        finally:
            _Call.running.discard(self)
            self.done.set()


def _let_abandoned_calls_end() -> None:
    # At exit the interpreter freezes daemon threads where they are; one frozen in
    # the middle of litellm's lazy imports keeps that module's lock, and litellm's
    # finalizers import that module again: `phasegate run` hung after a call
    # abandoned at a 0.05 s timeout (tests/test_local_model.py). Such a call ends
    # at litellm's own timeout, the same; past a bound, exit goes on.
    deadline = time.monotonic() + _EXIT_WAIT_S
    for call in list(_Call.running):
        call.done.wait(max(0.0, deadline - time.monotonic()))


atexit.register(_let_abandoned_calls_end)


def _connection_error(exc: BaseException) -> OSError | None:
    """The socket error under litellm's and openai's wrapping (ConnectionRefusedError,
    a DNS failure, ...) when the call failed before any HTTP answer, else None."""
    found: OSError | None = None
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        if isinstance(link, OSError):
            found = link
        link = link.__cause__ or link.__context__
    return found


class ApiRunner:
    name = "api"

    def __init__(self, binding: RoleBinding, workspace: Workspace | None = None) -> None:
        self.binding = binding
        self.workspace = workspace or Workspace()

    def messages(self, request: AgentRequest) -> list[dict[str, str]]:
        """The chat messages of ``request``: a system prompt and the user's message."""
        if request.read_only:
            return [
                {"role": "system", "content": READ_ONLY_SYSTEM},
                {"role": "user", "content": request.prompt},
            ]
        user = request.prompt + build_context(request.prompt, request.cwd) + _HOW_TO_ANSWER
        return [{"role": "system", "content": BUILD_SYSTEM}, {"role": "user", "content": user}]

    def run(
        self,
        request: AgentRequest,
        cancel: threading.Event,
        on_spawn: Callable[[int], None] | None = None,
    ) -> AgentResult:
        """Call the model once; as the build role, apply its diff in ``request.cwd``.

        ``on_spawn`` is never called: no process is started.
        """
        started = time.monotonic()
        litellm = _load_litellm()
        if litellm is None:
            return AgentResult(
                "",
                error_kind="runner_error",
                error="the api runner needs litellm: pip install 'phasegate[api]'",
            )
        b = self.binding
        key: str | None = None
        if b.api_key_env:
            key = child_env(b, base=()).get(b.api_key_env)
            if not key:
                return AgentResult(
                    "",
                    error_kind="runner_error",
                    error=f"{b.api_key_env} (the binding's api_key_env) is not set",
                )
        kwargs: dict[str, Any] = {
            "model": b.model,
            "messages": self.messages(request),
            "timeout": request.timeout_s,
            "max_retries": 0,  # AgentService retries, within limits.agent_retries
            "num_retries": 0,
        }
        if b.base_url:
            kwargs["api_base"] = b.base_url
        if key:
            kwargs["api_key"] = key
        if b.max_tokens:
            kwargs["max_tokens"] = b.max_tokens

        def elapsed() -> float:
            return time.monotonic() - started

        if cancel.is_set():
            return AgentResult("", error_kind="interrupted", error="stopped by shutdown")
        deadline = time.monotonic() + request.timeout_s  # importing litellm is not the model's time
        call = _Call(lambda: litellm.completion(**kwargs))
        while not call.done.wait(_POLL_S):
            if cancel.is_set():
                return AgentResult(
                    "", error_kind="interrupted", error="stopped by shutdown", duration_s=elapsed()
                )
            if time.monotonic() >= deadline:
                return self._timeout(request, elapsed())
        if call.error is not None:
            return self._failure(litellm, call.error, key, request, elapsed())

        response = call.response
        choice = response.choices[0] if response.choices else None
        text = (choice.message.content if choice is not None else None) or ""
        usage = getattr(response, "usage", None)
        fields: dict[str, Any] = {
            "input_tokens": int(getattr(usage, "prompt_tokens", 0) or 0),
            "output_tokens": int(getattr(usage, "completion_tokens", 0) or 0),
        }
        fields["cost_usd"] = self._cost(litellm, response, **fields)
        fields["duration_s"] = elapsed()
        if request.budget_usd is not None and fields["cost_usd"] > request.budget_usd:
            return AgentResult(
                text,
                error_kind="budget",
                error=f"the call cost ${fields['cost_usd']:.4f}, over the "
                f"${request.budget_usd:.4f} it may spend",
                **fields,
            )
        if request.read_only:
            return AgentResult(text, **fields)
        return self._apply(request, text, getattr(choice, "finish_reason", None), fields)

    def _apply(
        self, request: AgentRequest, text: str, finish: str | None, fields: dict[str, Any]
    ) -> AgentResult:
        cut = " (the answer stopped at max_tokens)" if finish == "length" else ""
        diff = extract_diff(text)
        if diff is None:
            return AgentResult(
                text, error_kind="invalid_patch", error=f"the answer holds no diff{cut}", **fields
            )
        try:
            files = self.workspace.apply_patch(request.cwd, diff)
        except PatchError as exc:
            return AgentResult(text, error_kind="invalid_patch", error=f"{exc}{cut}", **fields)
        summary = f"\n\n(phasegate applied the diff to {len(files)} file(s): {', '.join(files)})"
        return AgentResult(text.rstrip() + summary, **fields)

    def _cost(
        self, litellm: ModuleType, response: Any, *, input_tokens: int, output_tokens: int
    ) -> float:
        b = self.binding
        if b.input_usd_per_mtok is not None or b.output_usd_per_mtok is not None:
            return (
                input_tokens * (b.input_usd_per_mtok or 0.0)
                + output_tokens * (b.output_usd_per_mtok or 0.0)
            ) / 1e6
        try:
            return float(litellm.completion_cost(completion_response=response, model=b.model))
        except Exception:  # litellm raises when its price table lacks the model: no price known
            return 0.0

    def _timeout(self, request: AgentRequest, duration: float) -> AgentResult:
        return AgentResult(
            "",
            error_kind="timeout",
            error=f"no answer within {request.timeout_s:g}s",
            duration_s=duration,
        )

    def _failure(
        self,
        litellm: ModuleType,
        exc: Exception,
        key: str | None,
        request: AgentRequest,
        duration: float,
    ) -> AgentResult:
        if isinstance(exc, litellm.Timeout):
            return self._timeout(request, duration)
        refused = _connection_error(exc)
        if refused is not None:
            # litellm calls a connection that never got an answer InternalServerError,
            # status 500: no server said 500, none was there to say anything.
            exc = refused
            where = f"model call failed (no connection to {self.binding.base_url or 'the API'})"
        else:
            status = getattr(exc, "status_code", None)
            where = (
                f"model API error {status}"
                if status
                else f"model call failed ({type(exc).__name__})"
            )
        message = " ".join(str(exc).split())[:1000]
        if key:
            message = message.replace(key, "***")
        return AgentResult(
            "", error_kind="model_error", error=f"{where}: {message}", duration_s=duration
        )
