"""What every runner that drives an agent CLI shares: the ``CliRunner`` base class.

One call of such a runner goes the same way whatever the program:

1. It refuses a request without a state dir (and, for a program that needs
   one, a binding without a model) as ``runner_error``.
2. It makes the program's home under the state dir (``home``) and sets up
   the call (``prepare``: its environment, and files that live as long as the
   call, such as a key file, removed after it).
3. It starts the program (``launch``: the command line, stdin, the files its
   tools' output goes to) under phasegate's supervisor, confined, killed at
   the request's timeout or at shutdown (``agents.process``).
4. A process that did not end on its own gives the kill's result
   (``timeout``, ``interrupted``, ``self_fenced``, ``runner_error``) with what
   the answered turns spent (``stopped``); one that ended is parsed
   (``finished``). Either way the sandbox's refusals are attached.
5. When the request resumes a session the program no longer has
   (``session_gone``), the line starts afresh once.

A subclass (``phasegate.agents.runners.*``) says only what is its program's:
its command line, environment, output parsing and quirks. The helpers below
(``as_int``, ``json_lines``, ``appended``, ``priced``...) are what several
parsers share.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from phasegate.agents.base import AgentRequest, AgentResult
from phasegate.agents.env import child_env
from phasegate.agents.process import ProcessOutcome, run_agent_process
from phasegate.config.cartridge import RoleBinding

__all__ = [
    "CliRunner",
    "Launch",
    "alias_key",
    "appended",
    "as_int",
    "json_lines",
    "provider_key_env",
    "read_text",
    "write_secret",
]


@dataclass
class Launch:
    """One start of a program: its command line (``argv``), its ``stdin`` (None:
    the request's prompt), ``transcript`` (what its tools printed, read after it
    ends: where the sandbox's refusals are looked for besides its output),
    the ``session_id`` it starts or resumes when its output may name none,
    the ``files`` its runner reads after it (by name), and ``spent``: the input
    and output tokens it spent, read after it ends, for a program whose usage
    is in a file rather than its output."""

    argv: list[str]
    stdin: str | None = None
    transcript: Callable[[], str] | None = None
    session_id: str | None = None
    files: dict[str, Path] = field(default_factory=dict)
    spent: Callable[[], tuple[int, int]] | None = None


class CliRunner:
    """A runner that drives one agent CLI. Subclasses set the class attributes
    and ``launch``/``finished``, and may override the other hooks."""

    name = "cli"
    #: The program started when the binding names no ``executable``.
    program = ""
    #: The program's home under the state dir; "" is ``<name>-home``.
    home_dir = ""
    #: Whether a binding without a ``model`` is refused (the program has no default).
    needs_model = False

    def __init__(self, binding: RoleBinding) -> None:
        self.binding = binding

    def executable(self) -> str:
        """The binding's ``executable``, else the program found on PATH, else its name."""
        return self.binding.executable or shutil.which(self.program) or self.program

    def home(self, request: AgentRequest) -> Path:
        """The program's home for ``request`` (its state dir must be set)."""
        assert request.state_dir is not None  # run() refuses a request without one
        return request.state_dir / (self.home_dir or f"{self.name}-home")

    # -- what a subclass says ----------------------------------------------------

    @contextmanager
    def prepare(self, request: AgentRequest) -> Iterator[dict[str, str]]:
        """The environment of one call; a subclass may write files for the call
        (before yielding) and remove them (after)."""
        yield child_env(self.binding)

    def launch(self, request: AgentRequest, env: dict[str, str], *, resume: bool) -> Launch:
        """The start of the program for ``request``: resuming its session when
        ``resume`` and the request names one."""
        raise NotImplementedError

    def finished(
        self, outcome: ProcessOutcome, request: AgentRequest, launch: Launch
    ) -> AgentResult:
        """The AgentResult of a process that ended on its own."""
        raise NotImplementedError

    def stopped(
        self, failure: AgentResult, outcome: ProcessOutcome, request: AgentRequest, launch: Launch
    ) -> AgentResult:
        """The AgentResult of a process killed (timeout, shutdown) or never started:
        ``failure``, with what the answered turns spent where the program says."""
        return failure

    def session_gone(self, result: AgentResult) -> bool:
        """Whether ``result`` says the resumed session is one the program no longer has."""
        return False

    def inspect(self, outcome: ProcessOutcome, request: AgentRequest) -> ProcessOutcome:
        """``outcome`` with the violations the program reports in words of its own."""
        return outcome

    # -- the run -----------------------------------------------------------------

    def run(
        self,
        request: AgentRequest,
        cancel: threading.Event,
        on_spawn: Callable[[int], None] | None = None,
    ) -> AgentResult:
        if request.state_dir is None:
            return AgentResult(
                "", error_kind="runner_error", error=f"{self.name} needs a state dir"
            )
        if self.needs_model and not self.binding.model:
            return AgentResult("", error_kind="runner_error", error=f"{self.name} needs a model")
        self.home(request).mkdir(parents=True, exist_ok=True)
        with self.prepare(request) as env:
            result = self.once(request, cancel, on_spawn, env, resume=True)
            if request.session_id and self.session_gone(result):
                # The session is gone (its home was cleared, or another checkout): afresh.
                result = self.once(request, cancel, on_spawn, env, resume=False)
        return result

    def once(
        self,
        request: AgentRequest,
        cancel: threading.Event,
        on_spawn: Callable[[int], None] | None,
        env: dict[str, str],
        *,
        resume: bool,
    ) -> AgentResult:
        """One start of the program, to its end, its timeout or shutdown."""
        env = {**env, **request.env}  # what phasegate gives every agent (its ports)
        launch = self.launch(request, env, resume=resume)
        outcome = run_agent_process(
            launch.argv,
            cwd=request.cwd,
            env=env,
            stdin=request.prompt if launch.stdin is None else launch.stdin,
            timeout_s=request.timeout_s,
            cancel=cancel,
            on_spawn=on_spawn,
            confinement=request.confinement,
            transcript=launch.transcript,
            prompt=request.prompt,
            on_output=request.on_output,
        )
        outcome = self.inspect(outcome, request)
        failure = outcome.failure(request.timeout_s)
        if failure is None:
            return outcome.attach(self.finished(outcome, request, launch))
        return outcome.attach(self.stopped(failure, outcome, request, launch))

    def priced(self, input_tokens: int, output_tokens: int) -> dict[str, Any]:
        """Tokens and their cost (USD) by the binding's ``input_usd_per_mtok`` and
        ``output_usd_per_mtok``: for a program that reports no cost."""
        b = self.binding
        cost = (
            input_tokens * (b.input_usd_per_mtok or 0.0)
            + output_tokens * (b.output_usd_per_mtok or 0.0)
        ) / 1_000_000
        return {"input_tokens": input_tokens, "output_tokens": output_tokens, "cost_usd": cost}


# -- what several runners' parsers share ------------------------------------------


def as_int(value: Any) -> int:
    """``value`` as an int; 0 for nothing or what is no number."""
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def json_lines(text: str) -> Iterator[dict[str, Any]]:
    """The JSON objects of ``text``, one a line; other lines, and a line cut short
    by a killed process, are skipped."""
    for line in text.splitlines():
        if not line.startswith("{"):
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(event, dict):
            yield event


def appended(root: Path, pattern: str) -> Callable[[], str]:
    """What is written to the files under ``root`` matching ``pattern`` from now on,
    read when the returned function is called (a call's part of its session logs)."""

    def sizes() -> dict[Path, int]:
        return {path: path.stat().st_size for path in root.glob(pattern)}

    before = sizes()

    def read() -> str:
        texts = []
        for path in sizes():
            with path.open("rb") as f:
                f.seek(before.get(path, 0))
                texts.append(f.read().decode("utf-8", "replace"))
        return "\n".join(texts)

    return read


def read_text(path: Path) -> str:
    """The text of a file the program writes; "" when it stopped before writing it."""
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return ""


def write_secret(path: Path, text: str) -> None:
    """Create ``path`` readable by its owner only, holding ``text`` (a key): it
    must not exist yet, so no file another wrote is reused."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)


def provider_key_env(model: str, bare: str | None) -> str | None:
    """The variable litellm reads the key of ``model``'s provider from:
    ``<PROVIDER>_API_KEY`` for ``provider/name``, ``bare`` for a name without one."""
    if "/" not in model:
        return bare if model else None
    provider = model.split("/", 1)[0]
    return re.sub(r"[^A-Z0-9]", "_", provider.upper()) + "_API_KEY"


def alias_key(binding: RoleBinding, env: dict[str, str], alias: str | None) -> dict[str, str]:
    """``env`` with the binding's key (``api_key_env``) also as ``alias``, unless the
    binding's ``env`` sets that variable itself."""
    key = binding.api_key_env
    if key and alias and key in env and alias not in binding.env:
        env[alias] = env[key]
    return env
