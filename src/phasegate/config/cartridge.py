"""The cartridge: ``phasegate.toml`` at the repository root, validated with pydantic.

A bad cartridge is a ``CartridgeError`` naming the file and the key, raised
before anything runs. Unknown keys are errors, not ignored: a
typo in a limit must not silently fall back to the default.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from phasegate.config.agents import (  # noqa: F401  (their home was here)
    RUNNERS,
    McpServer,
    RoleBinding,
    Roles,
    resolve_agents,
)
from phasegate.config.dashboard import DashboardSettings
from phasegate.config.forge import ForgeSettings
from phasegate.config.graph import (  # noqa: F401  (their home was here)
    EpicThreshold,
    GraphSettings,
    ReviewTierRule,
    ReviewTiers,
    WorkRouting,
)
from phasegate.config.landing_areas import (  # noqa: F401  (their home was here)
    CartridgeError,
    LandingAreas,
)
from phasegate.config.queue import QueueSettings
from phasegate.config.store_url import CARTRIDGE_FILE, blob_sha, resolve_store_url, sqlite_file
from phasegate.config.toml import TomlError, read_toml
from phasegate.core.profiles import BUILTIN_PROFILES, DEFAULT_PROFILE, AutomationProfile
from phasegate.graph.proposals import PROPOSAL_KINDS

__all__ = [
    "CARTRIDGE_FILE",
    "AutonomySettings",
    "Cartridge",
    "CartridgeError",
    "EpicThreshold",
    "GraphSettings",
    "LandingAreas",
    "Limits",
    "NotifySettings",
    "ProfileSettings",
    "QueueSettings",
    "ReviewTierRule",
    "ReviewTiers",
    "McpServer",
    "RoleBinding",
    "Roles",
    "WorkRouting",
    "blob_sha",
    "cartridge_from_document",
    "load_cartridge",
]


#: The roles the lifecycle binds, and the session line each one drives
#: (docs/contracts/lifecycle.md: session lines).
ROLE_SESSION_LINES = {
    "plan": "main",
    "plan_review": "review",
    "build": "main",
    "review": "review",
    "verification": "verification",
}
#: The development graph's optional roles; an unbound one is absent (docs/contracts/graph.md:
#: nodes).
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
#: Roles answering with a verdict on others' work: ``limits.max_review_parse_failures``
#: answers without a readable one pause the workflow.
REVIEW_ROLES = frozenset({"plan_review", "review"})


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)  # "yes" is not a bool


class Limits(_Strict):
    max_plan_rounds: int = Field(default=3, ge=1)
    """Plan and plan-review rounds before the last plan is taken."""
    max_pr_review_rounds: int = Field(default=3, ge=1)
    """Review rounds of the pull request, each after a development round."""
    require_full_review_rounds: bool = False
    """True: every one of max_pr_review_rounds runs, an approval included; an approved
    change is reviewed again, a pass of its own, until the last round approves it.
    Not read in graph mode, whose review tiers review each patch."""
    max_dev_retries: int = Field(default=2, ge=0, description="retries on failing checks")
    agent_retries: int = Field(default=2, ge=0, description="retries of a failed agent call")
    workflow_budget_usd: float | None = Field(
        default=None, gt=0, description="spend cap over every agent call of a workflow"
    )
    daily_budget_usd: float | None = Field(
        default=None,
        gt=0,
        description="USD this repository's workflows may spend a UTC day; a budget set "
        "with `phasegate budget set` wins over it (docs/budgets.md)",
    )
    monthly_budget_usd: float | None = Field(
        default=None,
        gt=0,
        description="USD this repository's workflows may spend a UTC month; a budget set "
        "with `phasegate budget set` wins over it (docs/budgets.md)",
    )
    max_verification_attempts: int = Field(default=3, ge=1)
    """Tries of a failing verifier (exit code, timeout) before the workflow pauses."""
    max_verification_parse_failures: int = Field(default=2, ge=1)
    """Verifier answers without a readable verdict before the workflow pauses."""
    max_review_parse_failures: int = Field(
        default=2,
        ge=1,
        description="answers without a readable verdict a review role (plan_review, "
        "review) may give in one go before the workflow pauses for a person",
    )
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


class WorkflowSettings(_Strict):
    base_branch: str | None = None
    """The branch workflows start from and merge into; unset: the branch checked out."""
    auto_merge: bool = False  # given here, it wins over the profile's default
    profile: str | None = None  # a built-in profile or a [profiles.NAME] table
    content_language: Literal["en", "zh"] = "en"
    """The language of reports and comments."""
    acceptance_verification: bool = True
    """Verify the merged change against the ticket after the merge."""
    branch_strategy: Literal["ticket", "epic"] = "ticket"
    """How an epic's pieces branch: ticket, each from the base and merged into it; epic, all
    on one branch phasegate/epic-<parent id> that the parent merges into the base at the end."""
    protected_paths: list[str] | None = Field(
        default=None,
        description="paths (a trailing / for a directory, or a glob) an agent's change to "
        "which waits for a person whatever the profile; None: protected.DEFAULT_PROTECTED_PATHS. "
        "phasegate.toml and the tracked files the checks run are protected anyway",
    )

    @field_validator("protected_paths")
    @classmethod
    def _relative_paths(cls, paths: list[str] | None) -> list[str] | None:
        for path in paths or ():
            if not path.strip() or path.startswith("/") or ".." in path.split("/"):
                raise ValueError(
                    f"{path!r} is not a path inside the repository "
                    "(relative, no '..'; a trailing / for a directory)"
                )
        return paths


class StoreSettings(_Strict):
    """``[store]``: ``url`` a SQLite file (``sqlite:///relative/to/the/repository.db``
    or ``sqlite:////absolute.db``) or a PostgreSQL server; None: the embedded default."""

    url: str | None = None
    """A SQLite file (sqlite:///relative/path.db, sqlite:////absolute.db) or a PostgreSQL server
    (postgresql://...); unset: .phasegate/state.db."""

    @field_validator("url")
    @classmethod
    def _a_file_or_a_server(cls, url: str | None) -> str | None:
        if url is None or not url.startswith("sqlite:"):
            return url
        rest = url.removeprefix("sqlite:")
        if not rest.startswith("///"):
            raise ValueError(
                "a SQLite store is a file: sqlite:///path/relative/to/the/repository.db "
                "or sqlite:////absolute/path.db"
            )
        if sqlite_file(url) is None:
            raise ValueError(
                "an in-memory SQLite store keeps nothing once the command ends; "
                "name a file: sqlite:///.phasegate/state.db"
            )
        return url


class NotifySettings(_Strict):
    """``[notify]``: where a workflow that needs a person says so
    (``phasegate.integrations.notify``). ``webhook`` (or the environment variable ``webhook_env``
    names: a webhook URL is often a secret) gets a JSON POST, ``format`` "slack"
    (``{"text"}``) or "ntfy" (``{"topic", "title", "message"}``, the topic the
    URL's last segment), within ``timeout_s`` seconds, tried ``retries`` more
    times; ``desktop``: notify-send too, where it is on PATH and a display is set;
    ``dashboard_url``: where people reach ``phasegate serve`` (through their tunnel
    or proxy): each notification ends with the workflow's page there."""

    webhook: str | None = Field(default=None, pattern=r"^https?://[^\s]+$")
    """The URL a notification is POSTed to."""
    webhook_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    """The environment variable holding the webhook's URL, which is often a secret."""
    format: Literal["slack", "ntfy"] = "slack"
    """The body's shape: slack ({"text"}) or ntfy (the topic is the URL's last segment)."""
    timeout_s: float = Field(default=5.0, gt=0, le=60)
    """Seconds one delivery may take."""
    retries: int = Field(default=2, ge=0, le=5)
    """Tries after the first on no answer, 429 or 5xx."""
    desktop: bool = True
    """Also notify-send, where it is on PATH and a display is set."""
    dashboard_url: str | None = Field(default=None, pattern=r"^https?://[^\s]+$")
    """Where people reach ``phasegate serve``: each notification ends with the workflow's page
    there."""

    @model_validator(mode="after")
    def _one_webhook(self) -> NotifySettings:
        if self.webhook and self.webhook_env:
            raise ValueError("give webhook or webhook_env, not both")
        if self.format == "ntfy" and self.webhook and not urlsplit(self.webhook).path.strip("/"):
            raise ValueError("format ntfy: the webhook is the topic's URL (https://ntfy.sh/TOPIC)")
        return self


class AutonomySettings(_Strict):
    """The ``[autonomy]`` table: per proposal kind, ``propose`` (a person gates it
    until it graduates) or ``auto``; graduation after ``graduation_streak``
    clean first-attempt approvals (0: never)."""

    policy: dict[str, Literal["propose", "auto"]] = Field(default_factory=dict)
    """Per proposal kind (item_create, draft_pr_create, merge), ``propose`` or ``auto``."""
    graduation_streak: int = Field(default=3, ge=0)
    """Clean first-attempt approvals in a row after which a kind graduates to auto; 0: never."""

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
    """A custom automation profile, ``[profiles.NAME]`` (docs/contracts/autonomy.md).

    Both thresholds are required, each in [0, 1]: below 1.0 the reversion is
    automatic, 1.0 leaves it to a person. ``auto_merge``, ``autonomy`` and
    ``graduation`` are the defaults the profile gives (as the built-ins do).
    """

    auto_reversion_from_apply: float = Field(ge=0, le=1, description="merge → planning")
    auto_strategy_revision: float = Field(ge=0, le=1, description="development → planning")
    auto_merge: bool = False
    """Merge without approve-merge."""
    autonomy: Literal["propose", "auto"] = "propose"
    """Proposals' default mode."""
    graduation: bool = True
    """Whether a proposal kind may graduate to auto."""


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
    notify: NotifySettings = Field(default_factory=NotifySettings)
    dashboard: DashboardSettings = Field(default_factory=DashboardSettings)
    queue: QueueSettings = Field(default_factory=QueueSettings)
    #: Agent profiles: named bindings roles refer to (``phasegate.config.agents``).
    agents: dict[str, RoleBinding] = Field(default_factory=dict)
    #: The git blob id of the text it was read from; None when made in code.
    _source_sha: str | None = PrivateAttr(default=None)

    @property
    def source_sha(self) -> str | None:
        """The git blob id (40 hex digits) of the TOML this cartridge was read from,
        as ``git hash-object`` gives it; None for a cartridge made in code."""
        return self._source_sha

    @model_validator(mode="before")
    @classmethod
    def _agent_profiles(cls, data: Any) -> Any:
        return resolve_agents(data)

    @model_validator(mode="after")
    def _profiles(self) -> Cartridge:
        for name in self.profiles:
            if name in BUILTIN_PROFILES:
                raise ValueError(f"profiles.{name}: {name!r} is a built-in profile; rename it")
        chosen = self.workflow.profile
        if chosen is not None and chosen not in BUILTIN_PROFILES and chosen not in self.profiles:
            raise ValueError(f"workflow.profile: {_unknown_profile(chosen, self.profiles)}")
        return self

    @model_validator(mode="after")
    def _tier_roles(self) -> Cartridge:
        # Tier 1 asks the review adversary, and the arbitrator whenever the reviewer and
        # the adversary disagree; tier 2 asks both every time (docs/contracts/graph.md:
        # review tiers). A tier whose roles are unbound would fail mid-run, so it is
        # refused here, before anything runs.
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
        """``store.url``, or the embedded default: SQLite at ``repo/.phasegate/state.db``.
        A relative SQLite path is the repository's (``repo``), wherever the command runs."""
        return resolve_store_url(repo, self.store.url)

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


#: Problems a cartridge error lists one a line; the rest are counted.
_ERRORS_SHOWN = 20


def _format_errors(path: Path, exc: ValidationError) -> str:
    """One line per problem, ``path: key: message``; past ``_ERRORS_SHOWN`` lines the
    rest are counted in a last line, so a cartridge with 100,000 unknown keys is
    refused in a screenful, not 100,000 lines."""
    lines: list[str] = []
    unknown = 0
    errors = exc.errors(include_url=False, include_context=False)
    for error in errors:
        unknown += error["type"] == "extra_forbidden"
        if len(lines) == _ERRORS_SHOWN:
            continue
        key = ".".join(str(part) for part in error["loc"])
        message = "unknown key" if error["type"] == "extra_forbidden" else error["msg"]
        message = message.removeprefix("Value error, ")
        given = error.get("input")
        if error["type"] == "list_type" and isinstance(given, str) and error["loc"]:
            # One string where a list goes: the list it meant, in TOML.
            message += f"; write {error['loc'][-1]} = [{json.dumps(given)}]"
        # A model's own check names its key in the message ("graph.review_tiers...: ..."):
        # printed as it is, neither under a "(top level)" nor under its table's key twice.
        if not key or message.startswith((f"{key}.", f"{key}:")):
            lines.append(f"{path}: {message}")
        else:
            lines.append(f"{path}: {key}: {message}")
    if len(errors) > len(lines):
        lines.append(
            f"{path}: … and {len(errors) - len(lines):,} more problems "
            f"({unknown:,} unknown keys in all)"
        )
    return "\n".join(lines)


def load_cartridge(repo: Path) -> Cartridge:
    """Read and validate ``repo/phasegate.toml``, the file as it is in the checkout.
    Raises CartridgeError."""
    path = repo / CARTRIDGE_FILE
    if not path.is_file():
        raise CartridgeError(f"{path}: no cartridge; run `phasegate init` in the repository")
    try:
        raw = read_toml(path)
    except TomlError as exc:
        raise CartridgeError(str(exc)) from None
    return cartridge_from_document(repo, raw, sha=blob_sha(path.read_bytes()))


def cartridge_from_document(
    repo: Path, document: dict[str, Any], *, where: Path | None = None, sha: str | None = None
) -> Cartridge:
    """Validate ``document``, the TOML of ``repo/phasegate.toml`` as read (for a
    caller that reads it once for more than this); ``where`` names it in errors
    (default: the checkout's file), ``sha`` is its git blob (``source_sha``).
    Raises CartridgeError naming each key, past 20 problems counting the rest."""
    try:
        cartridge = Cartridge.model_validate(document)
    except ValidationError as exc:
        raise CartridgeError(_format_errors(where or repo / CARTRIDGE_FILE, exc)) from None
    cartridge.landing_areas.worktree_dir(repo)  # raises naming the key
    cartridge._source_sha = sha
    return cartridge
