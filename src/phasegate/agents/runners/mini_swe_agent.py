"""The ``mini-swe-agent`` runner: the mini-SWE-agent CLI (``mini``), non-interactive.

Facts about the CLI (PyPI ``mini-swe-agent`` 2.4.6, checked offline against
``phasegate.testing.model_server``):

- Its model calls go through litellm as OpenAI chat completions
  (``POST {api_base}/chat/completions``, plain JSON, ``tools=[bash]``). Each
  assistant turn must call the one tool, ``bash`` with ``{"command": ...}``;
  a turn without a tool call is a format error fed back to the model as a
  user message, and three in a row end the run (``RepeatedFormatError``).
  Every command runs in a fresh ``bash`` subshell in the working directory,
  with the agent's own environment (so it can see its key, like any shell agent).
- A run ends when a command's output starts with the line
  ``COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`` (the rest of the output is the
  ``submission``), at ``agent.step_limit`` model calls or past
  ``agent.cost_limit`` USD (both ``LimitsExceeded``, exit code 0), or on an
  exception (a litellm error after its retries: exit code 1 with a traceback).
- ``-c FILE`` replaces the built-in ``mini.yaml``; several are merged, and
  ``key=value`` specs too. A relative ``-c`` name is looked up in the working
  directory first, so phasegate passes one absolute file of its own (JSON,
  which is YAML) holding the templates, the task (no argv length limit), the
  model and the limits. ``-o FILE`` is needed: the CLI's own default output
  path overrides one in a config file.
- ``--agent-class default`` never prompts (the interactive agent asks before
  running commands and before exiting). Without ``MSWEA_CONFIGURED`` the CLI
  starts a first-run setup dialog; ``MSWEA_GLOBAL_CONFIG_DIR`` is where it
  reads ``.env`` and writes by default; ``MSWEA_SILENT_STARTUP`` drops the
  banner. litellm fetches its price table from the network on import unless
  ``LITELLM_LOCAL_MODEL_COST_MAP=True``.
- The trajectory JSON (``-o``) has ``info.exit_status`` (``Submitted``,
  ``LimitsExceeded``, ``RepeatedFormatError`` or an exception's class name),
  ``info.submission``, ``info.model_stats`` (``instance_cost`` in USD,
  ``api_calls``) and ``messages``, each model response with its ``usage``.
  It is written after every step, so it is there even when the run fails.
- Cost is litellm's: a model litellm does not price costs 0 (phasegate sets
  ``cost_tracking: ignore_errors``, else mini stops with an error); the
  binding's ``input_usd_per_mtok``/``output_usd_per_mtok`` are given to
  litellm as a model registry, so mini's own ``cost_limit`` can stop it.
- Retries: mini retries a failed model call up to
  ``MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT`` (10) times with backoff, and the
  OpenAI client under litellm twice more per try
  (``-c model.model_kwargs.max_retries=N``). phasegate leaves both to the
  binding (``env``, ``extra_args``), as it does for the other CLIs.
- No sessions: every call starts a fresh conversation; the prompt carries
  what the role needs. No read-only mode either: a read-only role is told not
  to change files, and AgentService undoes any change it makes in its clean
  checkout and fails the call as ``read_only_violation``.

How phasegate drives it:

- ``model`` is the litellm model name (``openai/<name>`` with ``base_url``
  for an OpenAI-compatible server; ``base_url`` becomes ``api_base``).
- The key: the variable ``api_key_env`` names is passed, and its value also
  as ``<PROVIDER>_API_KEY`` (``OPENAI_API_KEY`` for ``openai/...``), the
  variable litellm reads for the model's provider. Never on the command line
  or in the config file.
- HOME and ``MSWEA_GLOBAL_CONFIG_DIR`` are a directory of the workflow's own;
  the config and trajectory of a role's last call are kept there. The
  trajectory holds every command's output as the model saw it (a command
  that prints the environment puts the key there); phasegate reads only the
  answer, usage and status from it, and the store never holds it.
- One command may run for 300 s (mini's default is 30 s), never longer than
  the call's timeout.
- ``max_turns`` is ``agent.step_limit``; the call's budget is
  ``agent.cost_limit`` (no budget: no limit, not mini's default of $3).
- The answer is the submission when the agent printed one after the marker,
  else the text of its last message (the one that submitted).
- Error kinds: ``max_turns``, ``budget``, ``model_error`` (an API error, or
  no tool call three times), ``timeout``, ``exit_code`` (any other failure),
  ``runner_error``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from phasegate.agents.base import AgentRequest, AgentResult
from phasegate.agents.cli_runner import CliRunner, Launch, alias_key, provider_key_env, read_text
from phasegate.agents.env import child_env
from phasegate.agents.process import ProcessOutcome

__all__ = ["MiniSweAgentRunner", "parse_trajectory"]

SUBMIT = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"

SYSTEM_TEMPLATE = (
    "You are a software engineering agent working without a person at hand, "
    "in a checkout of a git repository. Nobody will answer questions."
)
INSTANCE_TEMPLATE = (
    "{{task}}\n\n"
    "## How to work here\n\n"
    "You act through the `bash` tool: every response must call it at least once. "
    "Each command runs in a fresh subshell in the repository's working directory; "
    "`cd` and variables do not carry over to the next command.\n\n"
    "When you are done, write your final answer (everything the task asks you to "
    "report, in the form it asks) as the text of your last response, and in that "
    f"response call the tool with exactly `echo {SUBMIT}`. The text of that response "
    "is your answer; after it you cannot continue."
)
READ_ONLY_NOTE = (
    "\n\nThis role is read-only: read files and run commands that change nothing. "
    "Any change to the checkout is undone and fails the task."
)
_COMMAND_TIMEOUT_S = 300  # one command's limit (mini's own default is 30 s: short for test suites)
_ENV_FOR_COMMANDS = {"PAGER": "cat", "MANPAGER": "cat", "GIT_PAGER": "cat", "TQDM_DISABLE": "1"}
# JSON is YAML, except for characters json.dumps leaves raw that YAML 1.1 (PyYAML)
# rejects as unprintable or reads as line breaks (NEL, LS, PS: folded to spaces).
_YAML_UNSAFE = re.compile("[\x7f-\x9f\u2028\u2029\ufffe\uffff]")


def _yaml_safe_json(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, indent=1)
    return _YAML_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _usage(messages: list[Any]) -> tuple[int, int]:
    input_tokens = output_tokens = 0
    for message in messages:
        extra = message.get("extra") if isinstance(message, dict) else None
        response = extra.get("response") if isinstance(extra, dict) else None
        usage = response.get("usage") if isinstance(response, dict) else None
        if isinstance(usage, dict):
            input_tokens += int(usage.get("prompt_tokens") or 0)
            output_tokens += int(usage.get("completion_tokens") or 0)
    return input_tokens, output_tokens


def _last_text(messages: list[Any]) -> str:
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "assistant":
            content = message.get("content")
            if isinstance(content, list):  # content parts
                content = "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            if content:
                return str(content).strip()
    return ""


def parse_trajectory(
    outcome: ProcessOutcome,
    trajectory: Mapping[str, Any] | None,
    *,
    step_limit: int = 0,
    cost_limit: float = 0.0,
) -> AgentResult:
    """The AgentResult of a finished ``mini`` process from its trajectory JSON.

    ``step_limit`` and ``cost_limit`` (USD) are the limits the run was given
    (0: none); they tell which limit a ``LimitsExceeded`` run reached.
    """
    if trajectory is None:
        kind = "exit_code" if outcome.returncode else "runner_error"
        return AgentResult(
            outcome.stdout,
            error_kind=kind,
            error=f"no trajectory from mini (exit code {outcome.returncode}): {outcome.tail()}",
            exit_code=outcome.returncode,
            duration_s=outcome.duration_s,
        )
    info = trajectory.get("info") or {}
    messages = list(trajectory.get("messages") or [])
    stats = info.get("model_stats") or {}
    input_tokens, output_tokens = _usage(messages)
    cost = float(stats.get("instance_cost") or 0.0)
    calls = int(stats.get("api_calls") or 0)
    fields: dict[str, Any] = {
        "exit_code": outcome.returncode,
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cost_usd": cost,
        "duration_s": outcome.duration_s,
    }
    status = str(info.get("exit_status") or "")
    last = messages[-1] if messages and isinstance(messages[-1], dict) else {}
    exit_text = str(last.get("content") or "") if last.get("role") == "exit" else ""
    text = str(info.get("submission") or "").strip() or _last_text(messages)
    if status == "Submitted" and not outcome.returncode:
        return AgentResult(text, **fields)
    if status == "LimitsExceeded":
        if 0 < cost_limit <= cost:
            return AgentResult(
                text,
                error_kind="budget",
                error=f"stopped at the call's budget of ${cost_limit:.4f} (spent ${cost:.4f})",
                **fields,
            )
        if 0 < step_limit <= calls:
            return AgentResult(
                text,
                error_kind="max_turns",
                error=f"stopped at the step limit after {calls} model calls",
                **fields,
            )
    if status == "TimeExceeded":
        return AgentResult(
            text, error_kind="timeout", error="stopped at mini's wall-time limit", **fields
        )
    if status == "RepeatedFormatError":
        return AgentResult(
            text,
            error_kind="model_error",
            error="the model answered without a bash tool call, repeatedly",
            **fields,
        )
    if exit_text.startswith("litellm.") or "litellm" in str(
        (last.get("extra") or {}).get("traceback", "")
    ):
        return AgentResult(
            text, error_kind="model_error", error=f"model API error: {exit_text[:500]}", **fields
        )
    return AgentResult(
        text,
        error_kind="exit_code",
        error=f"mini ended with {status or 'no status'} (exit code {outcome.returncode}): "
        + (exit_text[:500] or outcome.tail()),
        **fields,
    )


class MiniSweAgentRunner(CliRunner):
    name = "mini-swe-agent"
    program = "mini"
    home_dir = "mini-swe-agent"
    needs_model = True

    def config(self, request: AgentRequest, registry: Path | None) -> dict[str, Any]:
        """The config file's content (merged over nothing: it replaces ``mini.yaml``)."""
        b = self.binding
        model: dict[str, Any] = {
            "model_name": b.model,
            "cost_tracking": "ignore_errors",
            "model_kwargs": {"drop_params": True},
        }
        if b.base_url:
            model["model_kwargs"]["api_base"] = b.base_url
        if registry is not None:
            model["litellm_model_registry"] = str(registry)
        system = SYSTEM_TEMPLATE + (READ_ONLY_NOTE if request.read_only else "")
        return {
            "run": {"task": request.prompt},
            "agent": {
                "system_template": system,
                "instance_template": INSTANCE_TEMPLATE,
                "step_limit": b.max_turns or 0,
                "cost_limit": self._cost_limit(request),
            },
            "environment": {
                "env": dict(_ENV_FOR_COMMANDS),
                "timeout": int(min(_COMMAND_TIMEOUT_S, request.timeout_s)),
            },
            "model": model,
        }

    @staticmethod
    def _cost_limit(request: AgentRequest) -> float:
        if request.budget_usd is None:
            return 0.0
        return max(request.budget_usd, 0.0001)

    def argv(self, config: Path, trajectory: Path) -> list[str]:
        return [
            self.executable(),
            "--agent-class",
            "default",
            "-c",
            str(config),
            "-o",
            str(trajectory),
            *self.binding.extra_args,
        ]

    def environment(self, home: Path) -> dict[str, str]:
        b = self.binding
        extra = {
            "HOME": str(home),
            "MSWEA_GLOBAL_CONFIG_DIR": str(home),
            "MSWEA_CONFIGURED": "true",
            "MSWEA_SILENT_STARTUP": "1",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            # A plain traceback on failure: typer's rich one takes seconds to render.
            "_TYPER_STANDARD_TRACEBACK": "1",
        }
        alias = provider_key_env(b.model or "", None)
        return alias_key(b, child_env(b, extra=extra), alias)

    def _write_registry(self, home: Path) -> Path | None:
        b = self.binding
        if b.input_usd_per_mtok is None and b.output_usd_per_mtok is None:
            return None
        model = b.model or ""
        entry = {
            "input_cost_per_token": (b.input_usd_per_mtok or 0.0) / 1_000_000,
            "output_cost_per_token": (b.output_usd_per_mtok or 0.0) / 1_000_000,
            "litellm_provider": model.split("/", 1)[0] if "/" in model else "openai",
            "mode": "chat",
        }
        path = home / "model-registry.json"
        path.write_text(json.dumps({model: entry}), encoding="utf-8")
        return path

    @contextmanager
    def prepare(self, request: AgentRequest) -> Iterator[dict[str, str]]:
        yield self.environment(self.home(request))

    def launch(self, request: AgentRequest, env: dict[str, str], *, resume: bool) -> Launch:
        home = self.home(request)
        config = self.config(request, self._write_registry(home))
        config_path = home / f"{request.role}.config.yaml"
        config_path.write_text(_yaml_safe_json(config), encoding="utf-8")
        trajectory = home / f"{request.role}.traj.json"
        trajectory.unlink(missing_ok=True)  # never read a previous call's
        return Launch(
            self.argv(config_path, trajectory),
            stdin="",
            # The commands' outputs are in the trajectory, not on stdout.
            transcript=lambda: read_text(trajectory),
            files={"trajectory": trajectory},
        )

    def finished(
        self, outcome: ProcessOutcome, request: AgentRequest, launch: Launch
    ) -> AgentResult:
        return parse_trajectory(
            outcome,
            _read_json(launch.files["trajectory"]),
            step_limit=self.binding.max_turns or 0,
            cost_limit=self._cost_limit(request),
        )


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None
