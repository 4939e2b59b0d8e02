"""The cartridge: ``phasegate.toml`` at the repository root, validated with pydantic.

A bad cartridge is a ``CartridgeError`` naming the file and the key, raised
before anything runs (DESIGN.md §4). Unknown keys are errors, not ignored: a
typo in a limit must not silently fall back to the default.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from phasegate._toml import TomlError, read_toml
from phasegate.cartridge_forge import ForgeSettings
from phasegate.contract import PhasegateError
from phasegate.graph.proposals import PROPOSAL_KINDS
from phasegate.profiles import BUILTIN_PROFILES, DEFAULT_PROFILE, AutomationProfile

__all__ = [
    "CARTRIDGE_FILE",
    "AutonomySettings",
    "Cartridge",
    "CartridgeError",
    "EpicThreshold",
    "GraphSettings",
    "LandingAreas",
    "Limits",
    "ProfileSettings",
    "ReviewTierRule",
    "ReviewTiers",
    "RoleBinding",
    "Roles",
    "WorkRouting",
    "load_cartridge",
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
#: The development graph's optional roles (spec 002); an unbound one is absent.
GRAPH_OPTIONAL_ROLES = (
    "scope_epic",
    "plan_alternative",
    "plan_arbitrate",
    "plan_adversary",
    "review_adversary",
    "arbitrate",
)
#: The roles a workflow needs when the development graph runs its planning,
#: development and pr_review (``[graph] enabled``): the graph's required ones and
#: verification; plan_review is not asked (the graph's plan stage replaces it).
GRAPH_MODE_ROLES = ("plan", "build", "review", "verification")
#: Every role a cartridge may bind.
ALL_ROLES = (*ROLE_SESSION_LINES, *GRAPH_OPTIONAL_ROLES)
#: Roles that must not write to the worktree.
READ_ONLY_ROLES = frozenset(
    {"plan", "plan_review", "review", "verification", *GRAPH_OPTIONAL_ROLES}
)


class CartridgeError(PhasegateError):
    """The cartridge is missing, unreadable or invalid; the message names the key."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)  # "yes" is not a bool


RUNNERS = ("command", "scripted", "claude-code", "codex", "api", "mini-swe-agent")

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
    "mini-swe-agent": frozenset(
        {
            "executable",
            "model",
            "base_url",
            "api_key_env",
            "max_turns",
            "extra_args",
            "input_usd_per_mtok",
            "output_usd_per_mtok",
        }
    ),
}
_COMMON_KEYS = frozenset(
    {"runner", "timeout", "env", "pass_env", "budget_usd", "sandbox", "network"}
)
_REQUIRED_KEYS = {
    "command": ("command",),
    "scripted": ("script",),
    "api": ("model",),
    "mini-swe-agent": ("model",),
}


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

    An agent's process gets only what the cartridge names: ``env`` (values),
    ``pass_env`` (variables passed through from phasegate's environment) and
    ``api_key_env`` (the variable holding the model key). Nothing else of
    phasegate's environment reaches it but PATH and the locale.

    ``sandbox`` is how its process is confined (``phasegate.sandbox``):
    "bwrap" (an error where bubblewrap does not work), "none", or unset:
    bwrap where it works, else none with a warning. ``network = false`` cuts
    a confined agent off the network (its model too: for a local one only).
    """

    runner: Literal["command", "scripted", "claude-code", "codex", "api", "mini-swe-agent"]
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
    sandbox: Literal["bwrap", "none"] | None = None
    network: bool = True

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
    # The development graph's optional roles (GRAPH_OPTIONAL_ROLES).
    scope_epic: RoleBinding | None = None
    plan_alternative: RoleBinding | None = None
    plan_arbitrate: RoleBinding | None = None
    plan_adversary: RoleBinding | None = None
    review_adversary: RoleBinding | None = None
    arbitrate: RoleBinding | None = None


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
    max_diff_bytes: int = Field(
        default=5_000_000,
        ge=1,
        description="bytes of a change (an attempt's diff, a proposal's patch) above "
        "which it is refused, never stored or committed",
    )
    max_answer_bytes: int = Field(
        default=1_000_000,
        ge=1,
        description="bytes of an agent's answer above which the call fails (oversized); "
        "the graph's build, which answers with a diff, is held to max_diff_bytes",
    )


class LandingAreas(_Strict):
    worktree_root: str = ".phasegate/worktrees"
    checks: list[str] = Field(default_factory=list)
    check_timeout: float = Field(default=600.0, gt=0, description="seconds per check")
    pass_env: list[str] = Field(
        default_factory=list, description="variables the checks see besides PATH, HOME, locale"
    )
    # How the checks are confined: as a role's ``sandbox`` and ``network``;
    # writable are the checkout and a private temp dir.
    sandbox: Literal["bwrap", "none"] | None = None
    network: bool = True

    def worktree_dir(self, repo: Path) -> Path:
        """Where the workflows' worktrees are made: ``worktree_root`` resolved against
        ``repo`` (an absolute path, or relative to the repository root).

        Raises CartridgeError naming ``landing_areas.worktree_root`` unless it is
        inside the repository's ``.phasegate/`` or outside the repository
        altogether and not one of its ancestors: worktrees made at ``/``, beside
        the repository's files, in its ``.git`` or in the checkout itself would
        mix agents' files with the person's (issue 10).
        """
        repo = repo.resolve()
        root = Path(self.worktree_root).expanduser()
        path = (root if root.is_absolute() else repo / root).resolve()
        own = repo / ".phasegate"
        key = f"{repo / CARTRIDGE_FILE}: landing_areas.worktree_root = {self.worktree_root!r}"
        if path == repo or path in repo.parents:
            where = "the repository itself" if path == repo else "an ancestor of the repository"
            raise CartridgeError(
                f"{key}: {path} is {where}; use a directory "
                "inside .phasegate/ (the default .phasegate/worktrees) or one "
                "outside the repository"
            )
        if path.is_relative_to(repo) and not (path != own and path.is_relative_to(own)):
            raise CartridgeError(
                f"{key}: {path} is inside the checkout; "
                "worktrees go inside .phasegate/ (the default "
                ".phasegate/worktrees) or outside the repository"
            )
        return path


class WorkflowSettings(_Strict):
    base_branch: str | None = None
    auto_merge: bool = False  # given here, it wins over the profile's default
    profile: str | None = None  # a built-in profile or a [profiles.NAME] table
    content_language: Literal["en", "zh"] = "en"
    acceptance_verification: bool = True


class StoreSettings(_Strict):
    url: str | None = None


class ReviewTierRule(_Strict):
    """``tier`` for a change when every condition the rule names holds (spec 002).

    ``min_files``, ``min_lines`` (insertions plus deletions) compare with the
    change facts; ``paths`` match when a touched path is one of them, under
    one ending in ``/``, or matched as a glob; ``self_modification`` when the
    change touches governance paths (true) or does not (false).
    """

    tier: int = Field(ge=0, le=2)  # not Literal: strict ints refuse `true`
    min_files: int | None = Field(default=None, ge=1)
    min_lines: int | None = Field(default=None, ge=1)
    paths: list[str] = Field(default_factory=list)
    self_modification: bool | None = None

    @model_validator(mode="after")
    def _has_condition(self) -> ReviewTierRule:
        if (
            self.min_files is None
            and self.min_lines is None
            and not self.paths
            and self.self_modification is None
        ):
            raise ValueError(
                "a tier rule needs a condition: min_files, min_lines, paths or self_modification"
            )
        return self


class ReviewTiers(_Strict):
    """How many reviewers a change gets: tier 0 review once, 1 with an adversary
    (and the arbitrator when the two disagree), 2 with the adversary and always the
    arbitrator. The highest matching tier wins; any tier of 1 or more needs both
    [roles.review_adversary] and [roles.arbitrate] bound."""

    default: int = Field(default=0, ge=0, le=2)
    rules: list[ReviewTierRule] = Field(default_factory=list)


class EpicThreshold(_Strict):
    """Pieces of work (scope_epic's SUBTASK lines) that make a parent, and an epic."""

    parent_at: int = Field(default=2, ge=2)
    epic_at: int = Field(default=5, ge=3)

    @model_validator(mode="after")
    def _ordered(self) -> EpicThreshold:
        if self.epic_at <= self.parent_at:
            raise ValueError("epic_at must be greater than parent_at")
        return self


#: Where scope may send a shape of ticket: ``build`` continues into the run; the
#: others stop it with an item_create proposal of the pieces.
WorkRoute = Literal["build", "breakdown", "roadmap"]


class WorkRouting(_Strict):
    """Where scope sends each shape of ticket (a WorkRoute); ``build`` continues
    into this run."""

    single: WorkRoute = "build"
    parent: WorkRoute = "breakdown"
    epic: WorkRoute = "roadmap"


class GraphSettings(_Strict):
    """The development graph's ``[graph]`` table (spec 002)."""

    enabled: bool = Field(
        default=False,
        description="planning, development and pr_review of `phasegate run` follow the graph",
    )
    fix_attempts: int = Field(
        default=2, ge=0, description="build attempts after the first; 0 disables retries"
    )
    review_tiers: ReviewTiers = Field(default_factory=ReviewTiers)
    epic_threshold: EpicThreshold = Field(default_factory=EpicThreshold)
    work_routing: WorkRouting = Field(default_factory=WorkRouting)
    governance_paths: list[str] = Field(
        default_factory=list,
        description="paths that make a change self_modification, besides the cartridge and .ci/",
    )


class AutonomySettings(_Strict):
    """The ``[autonomy]`` table: per proposal kind, ``propose`` (a person gates it
    until it graduates) or ``auto``; graduation after ``graduation_streak``
    clean first-attempt approvals (0: never)."""

    policy: dict[str, Literal["propose", "auto"]] = Field(default_factory=dict)
    graduation_streak: int = Field(default=3, ge=0)

    @model_validator(mode="after")
    def _known_kinds(self) -> AutonomySettings:
        # A misspelled kind would otherwise leave the kind it meant on the default.
        for kind in self.policy:
            if kind not in PROPOSAL_KINDS:
                raise ValueError(
                    f"autonomy.policy.{kind}: unknown proposal kind; expected one of "
                    f"{', '.join(PROPOSAL_KINDS)}"
                )
        return self


class ProfileSettings(_Strict):
    """A custom automation profile, ``[profiles.NAME]`` (spec 003).

    Both thresholds are required, each in [0, 1]: below 1.0 the reversion is
    automatic, 1.0 leaves it to a person. ``auto_merge``, ``autonomy`` and
    ``graduation`` are the defaults the profile gives (as the built-ins do).
    """

    auto_reversion_from_apply: float = Field(ge=0, le=1, description="merge → planning")
    auto_strategy_revision: float = Field(ge=0, le=1, description="development → planning")
    auto_merge: bool = False
    autonomy: Literal["propose", "auto"] = "propose"
    graduation: bool = True


class Cartridge(_Strict):
    """The resolved configuration of one repository."""

    roles: Roles = Field(default_factory=Roles)
    limits: Limits = Field(default_factory=Limits)
    landing_areas: LandingAreas = Field(default_factory=LandingAreas)
    workflow: WorkflowSettings = Field(default_factory=WorkflowSettings)
    forge: ForgeSettings = Field(default_factory=ForgeSettings)
    store: StoreSettings = Field(default_factory=StoreSettings)
    graph: GraphSettings = Field(default_factory=GraphSettings)
    autonomy: AutonomySettings = Field(default_factory=AutonomySettings)
    profiles: dict[str, ProfileSettings] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _profiles(self) -> Cartridge:
        for name in self.profiles:
            if name in BUILTIN_PROFILES:
                raise ValueError(f"profiles.{name}: {name!r} is a built-in profile; rename it")
        name = self.workflow.profile
        if name is not None and name not in BUILTIN_PROFILES and name not in self.profiles:
            raise ValueError(f"workflow.profile: {_unknown_profile(name, self.profiles)}")
        return self

    @model_validator(mode="after")
    def _tier_roles(self) -> Cartridge:
        # Tier 1 asks the review adversary, and the arbitrator whenever the reviewer and
        # the adversary disagree; tier 2 asks both every time (spec 002). A tier whose
        # roles are unbound would fail mid-run, so it is refused here, before anything runs.
        tiers = self.graph.review_tiers
        keys = [
            ("graph.review_tiers.default", tiers.default),
            *(
                (f"graph.review_tiers.rules.{i}.tier", rule.tier)
                for i, rule in enumerate(tiers.rules)
            ),
        ]
        raised = [(key, tier) for key, tier in keys if tier >= 1]
        unbound = [
            role for role in ("review_adversary", "arbitrate") if getattr(self.roles, role) is None
        ]
        if raised and unbound:
            key, tier = raised[0]
            why = (
                " (the arbitrator decides when the reviewer and the adversary disagree)"
                if tier == 1
                else ""
            )
            missing = " and ".join(f"[roles.{role}]" for role in unbound)
            raise ValueError(
                f"{key}: tier {tier} needs [roles.review_adversary] and [roles.arbitrate]"
                f"{why}; {missing} {'is' if len(unbound) == 1 else 'are'} not bound"
            )
        return self

    def role(self, name: str) -> RoleBinding:
        """The binding of ``name``. Raises CartridgeError when the role is unbound."""
        binding = getattr(self.roles, name, None)
        if binding is None:
            raise CartridgeError(
                f"{CARTRIDGE_FILE}: roles.{name} is not bound; add a [roles.{name}] table"
            )
        return binding

    def profile(self, name: str | None = None) -> AutomationProfile:
        """The automation profile ``name`` (default: ``workflow.profile``, else
        ``review``): a built-in or a ``[profiles.NAME]`` table. Raises CartridgeError."""
        name = name or self.workflow.profile or DEFAULT_PROFILE
        if name in BUILTIN_PROFILES:
            return BUILTIN_PROFILES[name]
        custom = self.profiles.get(name)
        if custom is None:
            raise CartridgeError(_unknown_profile(name, self.profiles))
        return AutomationProfile(name=name, **custom.model_dump())

    def auto_merge_for(self, profile: AutomationProfile) -> bool:
        """``workflow.auto_merge`` when the cartridge gives it, else the profile's default."""
        if "auto_merge" in self.workflow.model_fields_set:
            return self.workflow.auto_merge
        return profile.auto_merge

    def store_url(self, repo: Path) -> str:
        """``store.url``, or the embedded default: SQLite at ``repo/.phasegate/state.db``."""
        return self.store.url or f"sqlite:///{repo / '.phasegate' / 'state.db'}"

    def required_roles(self) -> tuple[str, ...]:
        """The roles `phasegate run` needs bound: ROLE_SESSION_LINES, or GRAPH_MODE_ROLES
        when ``[graph] enabled``."""
        return GRAPH_MODE_ROLES if self.graph.enabled else tuple(ROLE_SESSION_LINES)

    def workflow_roles(self) -> tuple[str, ...]:
        """The roles a workflow may ask: the required ones, and in graph mode the
        optional graph roles that are bound (an unbound one is absent)."""
        if not self.graph.enabled:
            return self.required_roles()
        bound = [name for name in GRAPH_OPTIONAL_ROLES if getattr(self.roles, name) is not None]
        return (*self.required_roles(), *bound)

    def missing_roles(self) -> list[str]:
        return [name for name in self.required_roles() if getattr(self.roles, name) is None]

    def require_roles(self, where: str | Path = CARTRIDGE_FILE) -> None:
        """Raise CartridgeError naming every required role left unbound (``where``
        names the file in the message)."""
        missing = self.missing_roles()
        if missing:
            raise CartridgeError(
                f"{where}: roles not bound: {', '.join('roles.' + m for m in missing)}"
            )


def _unknown_profile(name: str, custom: Mapping[str, object]) -> str:
    known = ", ".join([*BUILTIN_PROFILES, *custom])
    return (
        f"unknown profile {name!r}; expected one of {known} "
        f"(or a [profiles.{name}] table in {CARTRIDGE_FILE})"
    )


def _format_errors(path: Path, exc: ValidationError) -> str:
    lines = []
    for error in exc.errors():
        key = ".".join(str(part) for part in error["loc"])
        message = "unknown key" if error["type"] == "extra_forbidden" else error["msg"]
        message = message.removeprefix("Value error, ")
        # A model's own check names its key in the message ("graph.review_tiers...: ..."):
        # printed as it is, neither under a "(top level)" nor under its table's key twice.
        if not key or message.startswith((f"{key}.", f"{key}:")):
            lines.append(f"{path}: {message}")
        else:
            lines.append(f"{path}: {key}: {message}")
    return "\n".join(lines)


def load_cartridge(repo: Path) -> Cartridge:
    """Read and validate ``repo/phasegate.toml``. Raises CartridgeError."""
    path = repo / CARTRIDGE_FILE
    if not path.is_file():
        raise CartridgeError(f"{path}: no cartridge; run `phasegate init` in the repository")
    try:
        raw = read_toml(path)
    except TomlError as exc:
        raise CartridgeError(str(exc)) from None
    try:
        cartridge = Cartridge.model_validate(raw)
    except ValidationError as exc:
        raise CartridgeError(_format_errors(path, exc)) from None
    cartridge.landing_areas.worktree_dir(repo)  # raises naming the key
    return cartridge
