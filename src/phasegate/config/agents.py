"""The cartridge's agents: which runners there are, the keys each reads, a role's
binding to one (``[roles.<role>]`` in ``phasegate.toml``), and the agent
profiles roles refer to by name (``[agents.<name>]``).

An agent profile is a binding with a name: a program with its model, flags,
environment and MCP servers. A role names it (``agent = "<name>"``, or the
role's value is the name alone) and may set any of the runner's keys besides:
the role's value replaces the profile's, except ``env`` and ``mcp_servers``,
merged entry by entry (the role's winning). A role that names a profile takes
its runner: a ``runner`` of its own is an error, as is a profile unknown.
``phasegate.config.cartridge`` re-exports what is public here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "AGENT_PROGRAMS",
    "MCP_RUNNERS",
    "RUNNERS",
    "AgentProgram",
    "McpServer",
    "RoleBinding",
    "Roles",
    "required_keys",
    "resolve_agents",
    "runner_keys",
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)  # "yes" is not a bool


#: A runner's name, as ``[roles.<role>] runner`` gives it.
RunnerName = Literal[
    "command",
    "scripted",
    "claude-code",
    "codex",
    "api",
    "mini-swe-agent",
    "aider",
    "gemini",
    "opencode",
    "copilot",
    "qwen",
]
RUNNERS: tuple[str, ...] = get_args(RunnerName)


@dataclass(frozen=True)
class AgentProgram:
    """An agent CLI a runner drives: the executable it starts when a binding names
    none, how a person installs it, the variable its model key is usually in, and
    whether a binding must name a model (``init`` binds only one that need not)."""

    runner: str
    executable: str
    install: str
    key_env: str | None
    needs_model: bool = False


#: Every agent CLI phasegate drives, in the order ``init`` prefers them.
AGENT_PROGRAMS: dict[str, AgentProgram] = {
    program.runner: program
    for program in (
        AgentProgram(
            "claude-code", "claude", "npm install -g @anthropic-ai/claude-code", "ANTHROPIC_API_KEY"
        ),
        AgentProgram("codex", "codex", "npm install -g @openai/codex", "OPENAI_API_KEY"),
        AgentProgram("gemini", "gemini", "npm install -g @google/gemini-cli", "GEMINI_API_KEY"),
        AgentProgram("opencode", "opencode", "npm install -g opencode-ai", None, True),
        AgentProgram("qwen", "qwen", "npm install -g @qwen-code/qwen-code", "OPENAI_API_KEY", True),
        AgentProgram("copilot", "copilot", "npm install -g @github/copilot", None, True),
        AgentProgram("aider", "aider", "pipx install aider-chat", None, True),
        AgentProgram("mini-swe-agent", "mini", "pipx install mini-swe-agent", None, True),
    )
}

#: What a CLI runner that a binding prices reads: the program, its model and key,
#: extra arguments and the prices of its tokens.
_PRICED_CLI_KEYS = frozenset(
    {
        "executable",
        "model",
        "base_url",
        "api_key_env",
        "extra_args",
        "input_usd_per_mtok",
        "output_usd_per_mtok",
    }
)

#: The keys each runner reads, besides those every runner reads (_COMMON_KEYS).
_RUNNER_KEYS: dict[str, frozenset[str]] = {
    "command": frozenset({"command", "api_key_env"}),
    "scripted": frozenset({"script"}),
    "claude-code": frozenset(
        {
            "executable",
            "model",
            "base_url",
            "api_key_env",
            "max_turns",
            "append_system_prompt",
            "allowed_tools",
            "extra_args",
        }
    ),
    "codex": _PRICED_CLI_KEYS,
    "api": frozenset(
        {
            "model",
            "base_url",
            "api_key_env",
            "max_tokens",
            "input_usd_per_mtok",
            "output_usd_per_mtok",
        }
    ),
    "mini-swe-agent": _PRICED_CLI_KEYS | {"max_turns"},
    "aider": _PRICED_CLI_KEYS,
    "gemini": _PRICED_CLI_KEYS | {"max_turns"},
    "opencode": _PRICED_CLI_KEYS,
    "qwen": _PRICED_CLI_KEYS | {"max_turns"},
    "copilot": _PRICED_CLI_KEYS,
}
_COMMON_KEYS = frozenset(
    {"runner", "agent", "timeout", "env", "pass_env", "budget_usd", "sandbox", "network"}
)

#: The runners whose program takes MCP servers (``mcp_servers``), each in its own
#: configuration (``phasegate.agents.mcp``).
MCP_RUNNERS = frozenset({"claude-code", "codex", "gemini", "opencode", "qwen"})
for _runner in MCP_RUNNERS:
    _RUNNER_KEYS[_runner] = _RUNNER_KEYS[_runner] | {"mcp_servers"}

#: An MCP server's name: it becomes part of tool names (``mcp__<name>__<tool>``).
_MCP_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


class McpServer(_Strict):
    """One MCP server a program starts (``command``, with ``args`` and ``env``,
    speaking MCP on its stdin and stdout) or reaches (``url``, streamable HTTP).
    ``env`` is given to the server only, as written."""

    command: str | None = None
    """The program that starts the server, which speaks MCP on its stdin and stdout."""
    args: list[str] = Field(default_factory=list)
    """The arguments of ``command``."""
    env: dict[str, str] = Field(default_factory=dict)
    """Variables given to the server only, as written."""
    url: str | None = None
    """A server the program reaches over streamable HTTP (http:// or https://)."""

    @model_validator(mode="after")
    def _command_or_url(self) -> McpServer:
        if self.command is None and self.url is None:
            raise ValueError("give `command` (a server it starts) or `url` (one it reaches)")
        if self.command is not None and self.url is not None:
            raise ValueError("give `command` (a server it starts) or `url`, not both")
        if self.command is not None and not self.command.strip():
            raise ValueError("`command` is empty: name the program that starts the server")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"`url` must be http:// or https://, not {self.url!r}")
        if self.url is not None and (self.args or self.env):
            raise ValueError("`args` and `env` are for a `command`; a `url` server takes neither")
        return self


_REQUIRED_KEYS = {
    "command": ("command",),
    "scripted": ("script",),
    "api": ("model",),
    "mini-swe-agent": ("model",),
    "aider": ("model",),
    "opencode": ("model",),
    "qwen": ("model",),
    "copilot": ("model",),
}


def runner_keys(runner: str) -> frozenset[str]:
    """The keys a binding of ``runner`` may set: those every runner reads and its own
    (the cartridge reference lists them). Raises KeyError for an unknown runner."""
    return _COMMON_KEYS | _RUNNER_KEYS[runner]


def required_keys(runner: str) -> tuple[str, ...]:
    """The keys a binding of ``runner`` must set besides ``runner`` itself."""
    return _REQUIRED_KEYS.get(runner, ())


class RoleBinding(_Strict):
    """Which runner plays a role, and with what.

    - ``command``: a shell command run in the worktree; the prompt arrives on
      stdin, in ``PHASEGATE_PROMPT`` and in the file ``PHASEGATE_PROMPT_FILE``;
      stdout is the answer.
    - ``scripted``: answers read from ``script`` (a TOML file, relative to
      the repository root); the fake for tests and the demo.
    - ``claude-code``: the Claude Code CLI (``claude -p``), one session per
      session line, resumed across rounds.
    - ``codex``: the Codex CLI (``codex exec --json``), resumed by thread id.
    - ``api``: a model called through litellm (any provider or an
      OpenAI-compatible ``base_url``); as the build role it answers with a
      unified diff that phasegate applies.
    - ``mini-swe-agent``: the mini-SWE-agent CLI (``mini``), its model called
      through litellm; a fresh conversation per call.
    - ``aider``: aider (``aider --message-file``), its model called through
      litellm; one chat history per session line, restored across rounds.
    - ``opencode``: the opencode CLI (``opencode run --format json``), resumed
      by session id; ``model`` is opencode's ``provider/model``, or with
      ``base_url`` the model id of an OpenAI-compatible server.
    - ``gemini``: Gemini CLI (``gemini -p``, stream-json), one session per
      session line, resumed across rounds; priced by the binding.
    - ``qwen``: Qwen Code (``qwen``, stream-json, the prompt on stdin), one
      session per session line, resumed across rounds; ``model`` is the id
      an OpenAI-compatible server (``base_url``, with ``/v1``) knows; priced
      by the binding.
    - ``copilot``: GitHub Copilot CLI (``copilot --output-format json``),
      resumed by session id; with ``base_url`` offline, its model through an
      OpenAI-compatible server (a provider of one's own); priced by the binding.

    An agent's process gets only what the cartridge names: ``env`` (values),
    ``pass_env`` (variables passed through from phasegate's environment) and
    ``api_key_env`` (the variable holding the model key). Nothing else of
    phasegate's environment reaches it but PATH and the locale.

    ``mcp_servers`` (claude-code, codex, gemini, opencode): MCP servers the
    program starts or reaches, each ``[...mcp_servers.<name>]`` a ``command``
    (with ``args``, ``env``) or a ``url``, written into the program's own
    configuration (``phasegate.agents.mcp``). ``agent``: the agent profile the
    binding came from (set by phasegate, from ``[agents.<name>]``).

    ``sandbox`` is how its process is confined (``phasegate.proc.sandbox``):
    "bwrap" (an error where bubblewrap does not work), "none", or unset:
    bwrap where it works, else none with a warning. ``network = false`` cuts
    a confined agent off the network (its model too: for a local one only).
    """

    runner: RunnerName
    """The program that plays the role (docs/runners.md)."""
    timeout: float = Field(default=900.0, gt=0, description="seconds; the agent is killed after")
    env: dict[str, str] = Field(default_factory=dict)
    """Variables set for the agent's process, as written; a secret-named one is redacted from every
    record."""
    pass_env: list[str] = Field(default_factory=list)
    """Names of variables passed through from phasegate's environment to the agent."""
    budget_usd: float | None = Field(default=None, gt=0, description="this role's spend cap")
    command: str | None = None
    """The shell command the ``command`` runner runs in the worktree."""
    script: str | None = None
    """The TOML file of scripted answers (``scripted`` runner), relative to the repository root."""
    executable: str | None = None
    """The program to start; unset: the runner's own name on PATH (claude, codex, gemini, ...)."""
    model: str | None = None
    """The model to call, in the runner's terms (a litellm name for api, aider, mini-swe-agent)."""
    base_url: str | None = None
    """The model endpoint called instead of the provider's: a local or an OpenAI-compatible server.
    """
    api_key_env: str | None = None
    """The environment variable holding the model key; passed to this role's process only."""
    max_turns: int | None = Field(default=None, ge=1)
    """Model turns the agent may take in one call."""
    append_system_prompt: str | None = None
    """Text Claude Code appends to its system prompt."""
    allowed_tools: list[str] | None = None
    """Claude Code's tools the role may use; unset: read and search tools for a read-only role,
    editing and shell tools for the build role."""
    extra_args: list[str] = Field(default_factory=list)
    """Arguments added to the program's command line."""
    max_tokens: int | None = Field(default=None, ge=1)
    """The bound of the model's answer, in tokens (``api`` runner): a diff must fit in it."""
    input_usd_per_mtok: float | None = Field(default=None, ge=0)
    """USD per million input tokens, to price the calls of a program that reports tokens only."""
    output_usd_per_mtok: float | None = Field(default=None, ge=0)
    """USD per million output tokens, as ``input_usd_per_mtok``."""
    sandbox: Literal["bwrap", "none"] | None = None
    """How the agent's process is confined: "bwrap" (an error where bubblewrap cannot work),
    "none", or unset: bwrap where it works."""
    network: bool = True
    """False cuts a confined agent off the network; its model must then be local."""
    mcp_servers: dict[str, McpServer] = Field(default_factory=dict)
    """MCP servers the program starts or reaches, by name (runners that take them only)."""
    agent: str | None = Field(default=None, description="the agent profile it came from")

    @model_validator(mode="after")
    def _runner_fields(self) -> RoleBinding:
        for key in sorted(self.model_fields_set - runner_keys(self.runner)):
            raise ValueError(f"`{key}` is not used by runner {self.runner!r}")
        for key in required_keys(self.runner):
            if not getattr(self, key):
                raise ValueError(f"runner {self.runner!r} needs a `{key}`")
        for name in self.mcp_servers:
            if not _MCP_NAME.fullmatch(name):
                raise ValueError(
                    f"mcp_servers.{name}: a server's name is letters, digits, - and _ "
                    "(it becomes part of its tools' names)"
                )
        return self


class Roles(_Strict):
    plan: RoleBinding | None = None
    plan_review: RoleBinding | None = None
    build: RoleBinding | None = None
    review: RoleBinding | None = None
    verification: RoleBinding | None = None
    # The development graph's optional roles (GRAPH_OPTIONAL_ROLES).
    scope_epic: RoleBinding | None = None
    plan_alternative: RoleBinding | None = None
    plan_arbitrate: RoleBinding | None = None
    plan_adversary: RoleBinding | None = None
    review_adversary: RoleBinding | None = None
    arbitrate: RoleBinding | None = None


def resolve_agents(data: Any) -> Any:
    """The raw cartridge ``data`` with every role that names an agent profile
    (``agent = "<name>"``, or the profile's name as the role's whole value) made
    the profile's binding with the role's own keys over it (the module's
    docstring); anything else as it is. Raises ValueError naming the key."""
    if not isinstance(data, dict) or not isinstance(data.get("roles"), dict):
        return data
    agents = data.get("agents") or {}
    if not isinstance(agents, dict):
        return data  # the model says what is wrong with it
    for name, profile in agents.items():
        if isinstance(profile, dict) and "agent" in profile:
            raise ValueError(f"agents.{name}.agent: a profile cannot name another profile")
    roles = dict(data["roles"])
    for role, table in roles.items():
        if isinstance(table, str):
            table = {"agent": table}
        if not isinstance(table, dict) or "agent" not in table:
            continue
        name = table["agent"]
        profile = agents.get(name) if isinstance(name, str) else None
        if not isinstance(profile, dict):
            known = ", ".join(sorted(agents)) or "none defined"
            raise ValueError(
                f"roles.{role}.agent: no agent profile {name!r} (profiles: {known}); "
                f"add an [agents.{name}] table"
            )
        if "runner" in table:
            raise ValueError(
                f"roles.{role}.runner: the role takes its runner from agent profile {name!r}; "
                "remove one of them"
            )
        merged = {**profile, **table}
        for key in ("env", "mcp_servers"):
            if isinstance(profile.get(key), dict) and isinstance(table.get(key), dict):
                merged[key] = {**profile[key], **table[key]}
        roles[role] = merged
    return {**data, "roles": roles}
