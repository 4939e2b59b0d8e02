"""The cartridge: ``phasegate.toml`` at the repository root, validated with pydantic.

A bad cartridge is a ``CartridgeError`` naming the file and the key, raised
before anything runs (DESIGN.md §4). Unknown keys are errors, not ignored: a
typo in a limit must not silently fall back to the default.
"""

from __future__ import annotations

import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from phasegate.contract import PhasegateError

__all__ = [
    "CARTRIDGE_FILE",
    "Cartridge",
    "CartridgeError",
    "LandingAreas",
    "Limits",
    "RoleBinding",
    "Roles",
    "load_cartridge",
    "render_default_cartridge",
]

CARTRIDGE_FILE = "phasegate.toml"

#: The roles the lifecycle binds, and the session line each one drives (spec 000).
ROLE_SESSION_LINES = {
    "plan": "main",
    "plan_review": "review",
    "build": "main",
    "review": "review",
    "verification": "verification",
}
#: Roles that must not write to the worktree.
READ_ONLY_ROLES = frozenset({"plan", "plan_review", "review", "verification"})


class CartridgeError(PhasegateError):
    """The cartridge is missing, unreadable or invalid; the message names the key."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


RUNNERS = ("command", "scripted", "claude-code", "codex", "api")

#: The keys each runner reads, besides those every runner reads (_COMMON_KEYS).
_RUNNER_KEYS: dict[str, frozenset[str]] = {
    "command": frozenset({"command"}),
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
    "codex": frozenset(
        {
            "executable",
            "model",
            "base_url",
            "api_key_env",
            "extra_args",
            "input_usd_per_mtok",
            "output_usd_per_mtok",
        }
    ),
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
}
_COMMON_KEYS = frozenset({"runner", "timeout", "env", "pass_env", "budget_usd"})
_REQUIRED_KEYS = {"command": ("command",), "scripted": ("script",), "api": ("model",)}


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

    An agent's process gets only what the cartridge names: ``env`` (values),
    ``pass_env`` (variables passed through from phasegate's environment) and
    ``api_key_env`` (the variable holding the model key). Nothing else of
    phasegate's environment reaches it but PATH and the locale.
    """

    runner: Literal["command", "scripted", "claude-code", "codex", "api"]
    timeout: float = Field(default=900.0, gt=0, description="seconds; the agent is killed after")
    env: dict[str, str] = Field(default_factory=dict)
    pass_env: list[str] = Field(default_factory=list)
    budget_usd: float | None = Field(default=None, gt=0, description="this role's spend cap")
    command: str | None = None
    script: str | None = None
    executable: str | None = None
    model: str | None = None
    base_url: str | None = None
    api_key_env: str | None = None
    max_turns: int | None = Field(default=None, ge=1)
    append_system_prompt: str | None = None
    allowed_tools: list[str] | None = None
    extra_args: list[str] = Field(default_factory=list)
    max_tokens: int | None = Field(default=None, ge=1)
    input_usd_per_mtok: float | None = Field(default=None, ge=0)
    output_usd_per_mtok: float | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _runner_fields(self) -> RoleBinding:
        allowed = _COMMON_KEYS | _RUNNER_KEYS[self.runner]
        for key in sorted(self.model_fields_set - allowed):
            raise ValueError(f"`{key}` is not used by runner {self.runner!r}")
        for key in _REQUIRED_KEYS.get(self.runner, ()):
            if not getattr(self, key):
                raise ValueError(f"runner {self.runner!r} needs a `{key}`")
        return self


class Roles(_Strict):
    plan: RoleBinding | None = None
    plan_review: RoleBinding | None = None
    build: RoleBinding | None = None
    review: RoleBinding | None = None
    verification: RoleBinding | None = None


class Limits(_Strict):
    max_plan_rounds: int = Field(default=3, ge=1)
    max_pr_review_rounds: int = Field(default=3, ge=1)
    max_dev_retries: int = Field(default=2, ge=0, description="retries on failing checks")
    agent_retries: int = Field(default=2, ge=0, description="retries of a failed agent call")
    workflow_budget_usd: float | None = Field(
        default=None, gt=0, description="spend cap over every agent call of a workflow"
    )
    max_verification_attempts: int = Field(default=3, ge=1)
    max_verification_parse_failures: int = Field(default=2, ge=1)


class LandingAreas(_Strict):
    worktree_root: str = ".phasegate/worktrees"
    checks: list[str] = Field(default_factory=list)
    check_timeout: float = Field(default=600.0, gt=0, description="seconds per check")


class WorkflowSettings(_Strict):
    base_branch: str | None = None
    auto_merge: bool = False
    content_language: Literal["en", "zh"] = "en"
    acceptance_verification: bool = True


class ForgeSettings(_Strict):
    kind: Literal["local"] = "local"


class StoreSettings(_Strict):
    url: str | None = None


class Cartridge(_Strict):
    """The resolved configuration of one repository."""

    roles: Roles = Field(default_factory=Roles)
    limits: Limits = Field(default_factory=Limits)
    landing_areas: LandingAreas = Field(default_factory=LandingAreas)
    workflow: WorkflowSettings = Field(default_factory=WorkflowSettings)
    forge: ForgeSettings = Field(default_factory=ForgeSettings)
    store: StoreSettings = Field(default_factory=StoreSettings)

    def role(self, name: str) -> RoleBinding:
        """The binding of ``name``. Raises CartridgeError when the role is unbound."""
        binding = getattr(self.roles, name, None)
        if binding is None:
            raise CartridgeError(
                f"{CARTRIDGE_FILE}: roles.{name} is not bound; add a [roles.{name}] table"
            )
        return binding

    def store_url(self, repo: Path) -> str:
        """``store.url``, or the embedded default: SQLite at ``repo/.phasegate/state.db``."""
        return self.store.url or f"sqlite:///{repo / '.phasegate' / 'state.db'}"

    def missing_roles(self) -> list[str]:
        return [name for name in ROLE_SESSION_LINES if getattr(self.roles, name) is None]


def _format_errors(path: Path, exc: ValidationError) -> str:
    lines = []
    for error in exc.errors():
        key = ".".join(str(part) for part in error["loc"]) or "(top level)"
        message = "unknown key" if error["type"] == "extra_forbidden" else error["msg"]
        message = message.removeprefix("Value error, ")
        lines.append(f"{path}: {key}: {message}")
    return "\n".join(lines)


def load_cartridge(repo: Path) -> Cartridge:
    """Read and validate ``repo/phasegate.toml``. Raises CartridgeError."""
    path = repo / CARTRIDGE_FILE
    if not path.is_file():
        raise CartridgeError(f"{path}: no cartridge; run `phasegate init` in the repository")
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise CartridgeError(f"{path}: not valid TOML: {exc}") from None
    try:
        return Cartridge.model_validate(raw)
    except ValidationError as exc:
        raise CartridgeError(_format_errors(path, exc)) from None


def _current_branch(repo: Path) -> str:
    out = subprocess.run(
        ["git", "symbolic-ref", "--short", "HEAD"], cwd=repo, capture_output=True, text=True
    )
    return out.stdout.strip() or "main"


def render_default_cartridge(repo: Path) -> str:
    """The cartridge ``phasegate init`` writes, with roles bound to agent CLIs found on PATH."""
    agent = None
    if shutil.which("claude"):
        agent = ("claude -p --permission-mode acceptEdits", "claude -p --permission-mode plan")
    elif shutil.which("codex"):
        agent = (
            "codex exec --skip-git-repo-check --full-auto -",
            "codex exec --skip-git-repo-check -s read-only -",
        )
    if agent:
        write_cmd, read_cmd = agent
        roles = "\n".join(
            f'[roles.{name}]\nrunner = "command"\n'
            f'command = "{read_cmd if name in READ_ONLY_ROLES else write_cmd}"\n'
            for name in ROLE_SESSION_LINES
        )
    else:
        roles = "# No agent CLI was found on PATH. Bind each role to a runner, e.g.:\n" + "\n".join(
            f'# [roles.{name}]\n# runner = "command"\n# command = "my-agent --role {name}"\n'
            for name in ROLE_SESSION_LINES
        )
    return f"""# phasegate cartridge: how this repository's tickets are worked.
# Every key is checked; an unknown or malformed key stops phasegate with its name.

[workflow]
base_branch = "{_current_branch(repo)}"
auto_merge = false          # true: merge without `phasegate approve-merge`
content_language = "en"     # "en" or "zh", for reports and comments
acceptance_verification = true

[limits]
max_plan_rounds = 3
max_pr_review_rounds = 3
max_dev_retries = 2
agent_retries = 2

[landing_areas]
worktree_root = ".phasegate/worktrees"
checks = []                 # commands that must pass, e.g. ["python -m pytest -q"]
check_timeout = 600

[forge]
kind = "local"

# Roles: plan, plan_review, build, review, verification.
# A command runner gets the prompt on stdin and prints its answer on stdout.
{roles}"""
